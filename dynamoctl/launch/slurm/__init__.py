"""Everything of Slurm, in one place: the step launcher (``launcher.py``), jobs as a whole
(``jobs.py``: sbatch, squeue, scancel, the batch script ``batch.sh``), Slurm's job states
(``state.py``) and the extra jobs of a deployment grown beyond its allocation
(``growth.py``, ``growth.sh``), which the supervisor asks for as the launcher's extra
capacity (:mod:`dynamoctl.launch.capacity`) without knowing they are Slurm jobs."""
