"""dynamoctl: LLM serving on Slurm, SSH-reachable nodes or one workstation, without Kubernetes."""

import os

__version__ = "0.1.0"

# gRPC (etcd discovery, OTLP traces) must not run its fork handlers: our processes fork only
# to exec (squeue, srun, ssh), and gRPC's handler, run in such a child while another thread
# was inside gRPC, aborted it before its exec (a Slurm deployment's supervisor saw squeue
# die of SIGABRT and failed its start). gRPC reads this once, when it loads; gRPC's own
# advice for fork-then-exec programs (grpc/grpc#13873).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
