"""What describes a run, and nothing that acts on one: the jobs file's model (``model``), the run
record and where its driver is (``record``), the control channel's files and Spark conf
(``channel``), the run lease (``lease``) and how run files are read (``files``).

Everything else in ``jobs/`` imports these; they import nothing else of ``jobs/``."""
