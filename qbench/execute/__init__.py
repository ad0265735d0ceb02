"""Running a sweep as a plan of jobs, in this process or on a Ray cluster.

plan.py           the jobs (build, measure), what each waits for and needs, content keys
jobs.py           what a job does (build a variant, measure it on a backend), wherever it runs
store.py          built variants by content, in a folder or behind an fsspec URI
snapshot.py       the copies of the input files a sweep reads (hashed once, never read again by path)
executors.py      the executor interface and the local executor
ray_executor.py   the Ray executor (Ray imported only here)
scheduler.py      the driver: starts ready jobs, records finished ones, retries, resumes
records.py        the run folder's plan and job records (what a resume reads)
overview.py       `qbench sweep --plan`: what would run where, and what is cached
"""

from qbench.execute.executors import Executor, LocalExecutor, make_executor
from qbench.execute.plan import Job, JobNeeds, SweepPlan, make_plan
from qbench.execute.records import resumable_run, write_plan
from qbench.execute.scheduler import PlanRun, run_plan
from qbench.execute.store import BuildStore

__all__ = [
    "BuildStore",
    "Executor",
    "Job",
    "JobNeeds",
    "LocalExecutor",
    "PlanRun",
    "SweepPlan",
    "make_executor",
    "make_plan",
    "resumable_run",
    "run_plan",
    "write_plan",
]
