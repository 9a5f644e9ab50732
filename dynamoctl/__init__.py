"""dynamoctl: LLM serving on Slurm, SSH-reachable nodes or one workstation, without Kubernetes."""

__version__ = "0.1.0"
