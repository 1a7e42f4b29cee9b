"""Launching jobs: hosts and host files (hosts), the MPI command a launch needs (launch, mpirun), its
supervision (supervise), pre-launch checks over ssh (prelaunch) and the per-rank trampoline that sets the
variables torchrun users expect (rankenv). The ddlrun command itself is ddl.tools.ddlrun."""
