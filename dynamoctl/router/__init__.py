"""The router: decides which worker serves a request; tokens never flow through it.

:class:`KvRouter` is the pure, synchronous decision state (KV index, booked load,
policies by name); :class:`RouterService` feeds it from discovery and the workers' KV
and load streams. It runs inside the frontend or as ``dynamoctl router``
(:mod:`dynamoctl.router.standalone`). See docs/router.md.
"""

from dynamoctl.router.approx import ApproxIndex
from dynamoctl.router.errors import AllWorkersBusy, NoWorkers, RouterError, UnknownMode
from dynamoctl.router.index import KvIndex, PrefixIndex
from dynamoctl.router.policies import Candidate, Policy, mode_names
from dynamoctl.router.router import Decision, KvRouter
from dynamoctl.router.service import RouterService

__all__ = [
    "AllWorkersBusy",
    "ApproxIndex",
    "Candidate",
    "Decision",
    "KvIndex",
    "KvRouter",
    "NoWorkers",
    "Policy",
    "PrefixIndex",
    "RouterError",
    "RouterService",
    "UnknownMode",
    "mode_names",
]
