"""The sweep: the pipeline recipe -> data -> variants -> backends -> validate -> track/report -> gate."""
