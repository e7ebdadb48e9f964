"""Launching a job's driver and telling what its runner knows: the detached local launcher
(``launcher``) and the runner back ends, local process group, standalone master, and the Spark
provider's cluster managers (``runners``). Imports only the run's description."""
