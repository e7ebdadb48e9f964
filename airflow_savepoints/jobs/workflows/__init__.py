"""The lifecycle workflows, run on an Airflow worker or at a terminal: the run object (``run``),
start, stop, cancel and status (``lifecycle``), an upgrade's check (``check``), a declared job's
rescale (``rescale``), upgrades (``upgrade``) and the watchdog (``watchdog``). Each imports only
those before it in this list, and the layers below them (launch, description)."""
