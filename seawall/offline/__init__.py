"""In-process serving: the scheduler core driving one model runner, no network (``seawall run-batch``)."""
