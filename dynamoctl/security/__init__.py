"""Key material of a deployment and how components receive it (docs/security.md).

Components never take a key or a certificate on their command line: they read them from
the environment variables named in :mod:`dynamoctl.security.names`, which the supervisor
fills through ``InstanceSpec.secrets`` (by reference to files in its private run
directory) and the launchers deliver without a command line.
"""
