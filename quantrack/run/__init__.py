"""``quantrack run`` by job (docs/architecture.md):

* ``outcome``     ArmOutcome / RunOptions / StudyResult: what an arm produced, as typed objects
* ``steps``       one function per step (serve, latency, sweep, eval, KL, ...)
* ``orchestrate`` the order of the steps, the study loop, what an interrupt or a failure logs
* ``schema``      every param, metric, tag and artifact name of an arm run (writer and readers share it)
* ``record``      ArmOutcome -> RunRecord (pure)
* ``narrate``     the progress lines
* ``imported``    ``quantrack log``: results measured elsewhere

Nothing is imported here, so ``quantrack.run.schema`` is cheap to import for compare/audit.
"""
