"""Lab errors (all raised; each also a RuntimeError or ValueError as before).

    LabError
    ├── FaultSetupError     a fault cannot be injected on this host (no cgroup controller, no netns, not root)
    └── WorkloadArgError    the lab workload was given arguments it cannot run with
"""


class LabError(Exception):
    """Base of all lab errors."""


class FaultSetupError(LabError, RuntimeError):
    """A real fault needs a host facility (a writable cgroup v1 controller, network namespaces, root)."""


class WorkloadArgError(LabError, ValueError):
    """Bad --fault/--fault-rank arguments to the lab workload."""
