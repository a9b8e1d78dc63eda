"""Planning a launch: options, checks, the plan, the console spec, run folder names, the dry run.

Pure: nothing here starts a process or talks to another host; the launcher's options become a
checked :class:`~unidist.launch.plan.job.LaunchPlan` (or one line that names what is wrong).
"""
