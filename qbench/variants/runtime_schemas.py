"""The schemas ONNX Runtime registers for its own operators (the `com.microsoft` contrib domain), as ONNX OpSchemas.

ONNX knows no schema for the operators ONNX Runtime's transformer optimizer writes (Attention,
SkipLayerNormalization, BiasGelu, EmbedLayerNormalization, FastGelu...), so a rule reading `onnx.defs` alone
cannot tell which of their inputs and outputs take float16. The installed ONNX Runtime registers their schemas
(type constraints included); `runtime_schema` returns them in onnx's own OpSchema form, so float_support reads
every operator's schema the same way, whichever library defines it.

`NARROWED_DOMAINS`: the domains outside ONNX's whose operators a narrower float type converts by their schemas, as
ONNX Runtime's float16 converter converts them (it narrows every operator outside its block list). An operator of
any other domain (ai.onnx.ml's tree ensembles and scalers, a custom domain) stays float32 whatever it accepts.
"""

from __future__ import annotations

import functools

import onnx

NARROWED_DOMAINS = ("com.microsoft",)


def runtime_schema(op_type: str, domain: str, version: int) -> onnx.defs.OpSchema | None:
    """ONNX Runtime's schema of `domain`'s `op_type` for opset `version` (the newest not after it), or None."""
    versions = _registered().get((domain, op_type), {})
    usable = [since for since in versions if since <= version]
    return versions[max(usable)] if usable else None


@functools.cache
def _registered() -> dict[tuple[str, str], dict[int, onnx.defs.OpSchema]]:
    """(domain, op type) -> since version -> schema, for the operators of NARROWED_DOMAINS ONNX Runtime registers;
    none from a build of ONNX Runtime that does not list its schemas (their operators then stay float32)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as runtime

    found: dict[tuple[str, str], dict[int, onnx.defs.OpSchema]] = {}
    for schema in getattr(runtime, "get_all_operator_schema", list)():
        if schema.domain in NARROWED_DOMAINS:
            found.setdefault((schema.domain, schema.name), {})[schema.since_version] = _as_onnx(schema)
    return found


def _as_onnx(schema: object) -> onnx.defs.OpSchema:
    """An ONNX Runtime schema object (its pybind form) as an onnx OpSchema: name, domain, version, formal inputs and
    outputs (with their option: single, optional, variadic) and type constraints."""
    options = onnx.defs.OpSchema.FormalParameterOption

    def formal(param: object) -> onnx.defs.OpSchema.FormalParameter:
        return onnx.defs.OpSchema.FormalParameter(
            param.name, param.typeStr, param_option=getattr(options, param.option.name),
            is_homogeneous=param.isHomogeneous)  # fmt: skip

    constraints = [(c.type_param_str, list(c.allowed_type_strs), c.description) for c in schema.type_constraints]
    return onnx.defs.OpSchema(schema.name, schema.domain, schema.since_version,
                              inputs=[formal(p) for p in schema.inputs],
                              outputs=[formal(p) for p in schema.outputs], type_constraints=constraints)  # fmt: skip
