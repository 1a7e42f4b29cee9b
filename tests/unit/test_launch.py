"""ddlrun's command building: placement, DDL_OPTIONS, DDL_HOST_LIST and the exact command lines for Open MPI
and MPICH, across flags and schedulers. Pure: the machine is described, the MPI flavour mocked, nothing runs."""
from dataclasses import replace

import pytest

from ddl.tools import ddlrun

from ddl.runner import hosts

from ddl.runner import launch

from ddl.runner import mpirun
from ddl.runner.hosts import Host
from ddl.runner.launch import LaunchError, Machine, Request

PY = "/v/bin/python"
GPU_BOX = Machine("login", cores=8, gpus=4, root=False, python=PY,
                  environ={"PATH": "/v/bin:/usr/bin", "HOME": "/h", "DDL_ALGO": "ring", "VIRTUAL_ENV": "/v"})
CPU_BOX = Machine("laptop", cores=2, gpus=0, root=True, python=PY, environ={"PATH": "/usr/bin"})
SHIM = [PY, "-m", "ddl.runner.rankenv"]


def commands(req, here=GPU_BOX):
    p = launch.plan(req, here)
    return p, {kind: mpirun.build(kind, "/v/bin/mpiexec", p.job, here.root, here.cores)
               for kind in ("openmpi", "mpich")}


def test_two_hosts_of_four_gpus_exact_command_lines():
    p, cmds = commands(Request(["python", "train.py"], hosts=[Host("n1"), Host("n2")]))
    assert p.rank_hosts == ["n1"] * 4 + ["n2"] * 4 and p.dims == (4, 2, 1, 1) and p.remote
    opts, hl = "-mode p:4x2x1x1", "n1:0,1,2,3;n2:4,5,6,7"
    assert cmds["openmpi"] == ([
        "/v/bin/mpiexec", "-n", "8", "--host", "n1,n1,n1,n1,n2,n2,n2,n2", "--map-by", "seq", "--bind-to", "none",
        "-x", f"DDL_OPTIONS={opts}", "-x", f"DDL_HOST_LIST={hl}", "-x", "DDL_BIND_GPU=1",
        "-x", "DDL_ALGO", "-x", "PATH", "-x", "VIRTUAL_ENV", *SHIM, "python", "train.py"], {})
    assert cmds["mpich"] == ([
        "/v/bin/mpiexec", "-hosts", "n1:4,n2:4", "-n", "8", "-genv", "DDL_OPTIONS", opts,
        "-genv", "DDL_HOST_LIST", hl, "-genv", "DDL_BIND_GPU", "1", *SHIM, "python", "train.py"], {})


def test_laptop_one_rank_per_core_as_root_oversubscribed():
    p, cmds = commands(Request(["prog"], np=4), CPU_BOX)
    assert p.rank_hosts == ["laptop"] * 4 and not p.remote
    cmd, env = cmds["openmpi"]
    assert cmd == ["/v/bin/mpiexec", "-n", "4", "--bind-to", "none", "-x", "DDL_OPTIONS=-mode p:4x1x1x1",
                   "-x", "DDL_HOST_LIST=laptop:0,1,2,3", "-x", "PATH", *SHIM, "prog"]
    assert env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_mpi_yield_when_idle": "1"}
    assert cmds["mpich"][0] == ["/v/bin/mpiexec", "-n", "4", "-genv", "DDL_OPTIONS", "-mode p:4x1x1x1",
                                "-genv", "DDL_HOST_LIST", "laptop:0,1,2,3", *SHIM, "prog"]
    # default rank count: one per core without GPUs, one per GPU with them
    assert len(launch.plan(Request(["prog"]), CPU_BOX).rank_hosts) == 2
    assert len(launch.plan(Request(["prog"]), GPU_BOX).rank_hosts) == 4


def test_flags_mode_options_tiers_tcp_mpiargs_output():
    req = Request(["p"], hosts=[Host(f"n{i}", 2) for i in range(8)], mode="r", ddloption="-dbg_level 1",
                  racks=2, aisles=2, tcp=True, mpiargs=("-x", "EGO_TOP"), output_dir="/logs")
    p, cmds = commands(req, CPU_BOX)
    assert p.dims == (2, 2, 2, 2)
    cmd, _ = cmds["openmpi"]
    assert cmd[cmd.index("--bind-to") + 2:cmd.index(SHIM[0])] == [
        "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp",
        "-x", "DDL_OPTIONS=-mode r:2x2x2x2 -dbg_level 1", "-x", "DDL_HOST_LIST=" + launch.host_list(p.rank_hosts),
        "-x", "DDL_NODES=2", "-x", "DDL_RACKS=2", "-x", "DDL_AISLES=2", "-x", "DDL_OUTPUT_DIR=/logs", "-x", "PATH", "-x", "EGO_TOP"]
    cmd, _ = cmds["mpich"]
    assert cmd[cmd.index("16") + 1:cmd.index("16") + 10] == [
        "-genv", "MPICH_CH4_NETMOD", "ofi", "-genv", "FI_PROVIDER", "tcp", "-genv", "DDL_OPTIONS",
        "-mode r:2x2x2x2 -dbg_level 1"]
    assert cmd[cmd.index("EGO_TOP") - 1:] == ["-x", "EGO_TOP", *SHIM, "p"]


def test_a_mode_with_dims_is_kept_and_no_ddloptions_sets_none():
    p = launch.plan(Request(["p"], np=4, mode="b:2x2"), CPU_BOX)
    assert p.job.set_env["DDL_OPTIONS"] == "-mode b:2x2"
    p = launch.plan(Request(["p"], np=4, no_ddloptions=True), CPU_BOX)
    assert "DDL_OPTIONS" not in p.job.set_env and p.job.set_env["DDL_HOST_LIST"] == "laptop:0,1,2,3"


def test_user_ddl_options_in_the_environment_are_not_forwarded_over_ddlruns():
    here = Machine("h", 2, 0, False, PY, {"DDL_OPTIONS": "-mode r", "DDL_TIMEOUT": "9"})
    job = launch.plan(Request(["p"], np=2), here).job
    assert job.forward == ("DDL_TIMEOUT",) and job.set_env["DDL_OPTIONS"] == "-mode p:2x1x1x1"
    job = launch.plan(Request(["p"], np=2, no_ddloptions=True), here).job
    assert job.forward == ("DDL_OPTIONS", "DDL_TIMEOUT")  # the program's own ddl.init reads them


def test_np_fills_hosts_in_order_and_never_beyond_their_slots():
    req = Request(["p"], np=5, hosts=[Host("a", 2), Host("b", 2), Host("c", 2)])
    p = launch.plan(req, CPU_BOX)
    assert p.rank_hosts == ["a", "a", "b", "b", "c"] and p.dims is None  # uneven: no tiers
    assert "DDL_OPTIONS=-mode p" in commands(req, CPU_BOX)[1]["openmpi"][0]
    with pytest.raises(LaunchError, match="-np 7 is more than the 6 slots.*a:2, b:2, c:2"):
        launch.plan(Request(["p"], np=7, hosts=[Host("a", 2), Host("b", 2), Host("c", 2)]), CPU_BOX)
    with pytest.raises(LaunchError, match="same number of ranks on every host"):
        launch.plan(Request(["p"], np=5, racks=1, hosts=[Host("a", 2), Host("b", 2), Host("c", 2)]), CPU_BOX)


def test_accelerators_set_the_slots_of_hosts_given_without_them():
    p = launch.plan(Request(["p"], hosts=[Host("a"), Host("b", 1)], accelerators=3), CPU_BOX)
    assert p.rank_hosts == ["a"] * 3 + ["b"] and p.job.set_env["DDL_BIND_GPU"] == "1"
    assert launch.plan(Request(["p"], hosts=[Host("a"), Host("b")]), CPU_BOX).rank_hosts == ["a", "b"]


def test_tiers_that_do_not_multiply_to_the_ranks_are_refused():
    four = [Host(f"n{i}", 2) for i in range(4)]
    assert launch.plan(Request(["p"], hosts=four, racks=2), CPU_BOX).dims == (2, 2, 2, 1)
    assert launch.plan(Request(["p"], hosts=four, nodes=2, racks=2), CPU_BOX).dims == (2, 2, 2, 1)
    with pytest.raises(LaunchError, match="2 ranks per node x 3 nodes per rack .* = 6 ranks, but the job has 8"):
        launch.plan(Request(["p"], hosts=four, nodes=3), CPU_BOX)


def test_rankfile_placement_goes_to_the_launcher_as_given():
    p, cmds = commands(Request(["p"], rank_hosts=["a", "b", "a", "b"]), CPU_BOX)
    assert p.dims is None and launch.host_list(p.rank_hosts) == "a:0,2;b:1,3"
    assert cmds["openmpi"][0][:7] == ["/v/bin/mpiexec", "-n", "4", "--host", "a,b,a,b", "--map-by", "seq"]
    assert cmds["mpich"][0][:5] == ["/v/bin/mpiexec", "-hosts", "a,b", "-n", "4"]
    with pytest.raises(LaunchError, match="rankfile places 4 ranks; -np 2"):
        launch.plan(Request(["p"], np=2, rank_hosts=["a", "b", "a", "b"]), CPU_BOX)


@pytest.mark.parametrize("env,expected_hosts", [
    ({"SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)"}, "gpu1:4,gpu2:4"),
    ({"LSB_MCPU_HOSTS": "batch 1 g1 4 g2 4"}, "g1:4,g2:4"),
    ({"LSB_MCPU_HOSTS": "g1 6 g2 6"}, "g1:6,g2:6"),
])
def test_scheduler_jobs_launch_on_their_hosts(env, expected_hosts):
    source, found = hosts.from_scheduler(env)
    p, cmds = commands(Request(["p"], hosts=found), CPU_BOX)
    assert cmds["mpich"][0][:3] == ["/v/bin/mpiexec", "-hosts", expected_hosts]
    per = int(expected_hosts.split(":")[1].split(",")[0])
    assert p.job.set_env["DDL_OPTIONS"] == f"-mode p:{per}x2x1x1"


def test_pbs_job_launches_on_its_nodefile(tmp_path):
    f = tmp_path / "nodefile"
    f.write_text("c1\nc1\nc2\nc2\n")
    _, found = hosts.from_scheduler({"PBS_NODEFILE": str(f)})
    _, cmds = commands(Request(["p"], hosts=found), CPU_BOX)
    assert cmds["openmpi"][0][:5] == ["/v/bin/mpiexec", "-n", "4", "--host", "c1,c1,c2,c2"]


def test_the_emulated_cluster_is_reached_through_its_agent():
    req = Request(["p"], rank_hosts=["node0", "node0", "node1", "node1"], agent="/w/agent.sh", iface="eth0")
    p, cmds = commands(req, CPU_BOX)
    assert p.dims == (2, 2, 1, 1)
    assert cmds["openmpi"][0][:20] == [
        "/v/bin/mpiexec", "-n", "4", "--host", "node0,node0,node1,node1", "--map-by", "seq", "--bind-to", "none",
        "--prtemca", "plm_ssh_agent", "/w/agent.sh", "--prtemca", "oob_tcp_if_include", "eth0",
        "--mca", "pml", "ob1", "--mca", "btl"]
    assert cmds["mpich"][0][:9] == ["/v/bin/mpiexec", "-launcher", "ssh", "-launcher-exec", "/w/agent.sh",
                                    "-iface", "eth0", "-hosts", "node0:2,node1:2"]


def test_program_is_the_first_argument_that_is_not_an_option():
    ap = ddlrun._parser()
    assert ddlrun.split_program(ap, ["-np", "4", "python", "-np", "2", "-v"]) == (["-np=4"],
                                                                                 ["python", "-np", "2", "-v"])
    assert ddlrun.split_program(ap, ["-v", "-s", "--mode=r", "-mode", "b", "prog"]) == (
        ["-v", "-s", "--mode=r", "-mode=b"], ["prog"])
    assert ddlrun.split_program(ap, ["--timeout", "5", "--", "-weird-program"]) == (["--timeout=5"],
                                                                                    ["-weird-program"])
    with pytest.raises(SystemExit):
        ddlrun.split_program(ap, ["--bogus", "prog"])


def test_ibm_single_dash_options_parse():
    ap = ddlrun._parser()
    options, program = ddlrun.split_program(ap, [
        "-mode", "b", "-hostfile", "h", "-racks", "2", "-aisles", "1", "-accelerators", "4", "-mpiarg",
        "-pami_noib", "-ddloption", "-dbg_level 1", "-tcp", "-no_ddloptions", "-n", "8", "prog"])
    a = ap.parse_args(options)
    assert program == ["prog"]
    assert (a.mode, a.hostfile, a.racks, a.aisles, a.accelerators, a.mpiarg, a.ddloption, a.tcp,
            a.no_ddloptions, a.np) == ("b", "h", 2, 1, 4, ["-pami_noib"], ["-dbg_level 1"], True, True, 8)


def _dry_run(monkeypatch, capsys, argv, environ=None, kind="openmpi"):
    monkeypatch.setenv("DDL_MPIEXEC", "/v/bin/mpiexec")
    monkeypatch.setattr(mpirun, "flavor", lambda exe: kind)
    monkeypatch.setattr(ddlrun, "_machine", lambda: CPU_BOX)
    for k in ("SLURM_JOB_NODELIST", "LSB_MCPU_HOSTS", "LSB_DJOB_HOSTFILE", "PBS_NODEFILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in (environ or {}).items():
        monkeypatch.setenv(k, v)
    rc = ddlrun.main(["--dry-run", *argv])
    return rc, capsys.readouterr().err


def test_dry_run_prints_a_copy_pastable_command(monkeypatch, capsys):
    rc, err = _dry_run(monkeypatch, capsys, ["-H", "a:2,b:2", "python", "t.py", "--lr", "0.1"])
    assert rc == 0
    assert err.strip().splitlines()[-1] == (
        "+ OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 /v/bin/mpiexec -n 4 --host a,a,b,b "
        "--map-by seq --bind-to none -x 'DDL_OPTIONS=-mode p:2x2x1x1' -x 'DDL_HOST_LIST=a:0,1;b:2,3' "
        "-x PATH /v/bin/python -m ddl.runner.rankenv python t.py --lr 0.1")


def test_dry_run_inside_slurm_uses_the_jobs_hosts(monkeypatch, capsys):
    rc, err = _dry_run(monkeypatch, capsys, ["-v", "prog"], kind="mpich",
                       environ={"SLURM_JOB_NODELIST": "c[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"})
    assert rc == 0 and "hosts from slurm: c1:0,1;c2:2,3" in err
    assert "+ /v/bin/mpiexec -hosts c1:2,c2:2 -n 4 -genv DDL_OPTIONS '-mode p:2x2x1x1'" in err


@pytest.mark.parametrize("argv,message", [
    (["-H", "a;rm -rf ~", "prog"], "not a valid host name"),
    (["-H", "a", "--hostfile", "f", "prog"], "give one of"),
    (["-H", "a:1", "-np", "3", "prog"], "more than the 1 slots"),
    (["--hostfile", "/nonexistent/hosts", "prog"], "No such file"),
    (["-m", "z", "prog"], "bad -mode 'z"),
    (["--ddloption", "-bogus 1", "prog"], "unknown DDL option '-bogus'"),
    (["--mpiarg", "'unclosed", "prog"], "No closing quotation"),
])
def test_bad_input_is_a_usage_error_naming_what(monkeypatch, capsys, argv, message):
    rc, err = _dry_run(monkeypatch, capsys, argv)
    assert rc == 2 and message in err and "+ " not in err


@pytest.mark.parametrize("argv", [["-np", "0", "p"], ["-np", "-2", "p"], ["--racks", "x", "p"]])
def test_counts_must_be_positive(monkeypatch, capsys, argv):
    with pytest.raises(SystemExit) as e:
        _dry_run(monkeypatch, capsys, argv)
    assert e.value.code == 2 and "expected a whole number of at least 1" in capsys.readouterr().err


def test_mpi_choice_must_match_the_launcher_found(monkeypatch, capsys):
    rc, err = _dry_run(monkeypatch, capsys, ["--mpi", "mpich", "-np", "2", "prog"])
    assert rc == 2 and "is openmpi's" in err and "DDL_MPIEXEC" in err


def _tree_for(mode: str, hosts: list[str]):
    from ddl.core.communicator import Communicator
    from ddl.options import parse

    reports = [{"host": h, "numa": None, "gpus": []} for h in hosts]
    c = Communicator(None, 0, len(hosts), options=parse(f"-mode {mode}", environ={}), reports=reports)
    return c.tree, c.topology


def test_ddlruns_dims_keep_discovery_and_other_dims_override_it():
    tree, topology = _tree_for("p:2x2x1x1", ["a", "a", "b", "b"])  # dims that follow the hosts
    assert topology is not None and tree == [[0, 1], [2, 3]]
    tree, topology = _tree_for("r:4", ["a", "a", "b", "b"])  # the user groups all four: dims win
    assert topology is None and tree == [0, 1, 2, 3]
    tree, topology = _tree_for("r:2x2", ["a", "b", "a", "b"])  # round-robin hosts, packed dims: dims win
    assert topology is None and tree == [[0, 1], [2, 3]]


def test_every_exportable_user_variable_travels_but_the_launchers_own():
    env = {"PATH": "/b", "MY_DATA": "/d", "NCCL_DEBUG": "INFO", "HOME": "/h", "OMPI_COMM_WORLD_RANK": "0",
           "SLURM_JOB_ID": "7", "BASH_FUNC_x%%": "() {}", "PWD": "/w", "bad-name": "1", "DDL_TIMEOUT": "9"}
    job = launch.plan(Request(["p"], np=2), Machine("h", 2, 0, False, PY, env)).job
    assert job.forward == ("DDL_TIMEOUT", "MY_DATA", "NCCL_DEBUG", "PATH")


def test_master_port_is_one_found_free_when_rank_0_runs_here():
    here = Machine("h", 2, 0, False, PY, {"PATH": "/b"}, free_port=40123)
    assert launch.plan(Request(["p"], np=2), here).job.set_env["MASTER_PORT"] == "40123"
    users = Machine("h", 2, 0, False, PY, {"MASTER_PORT": "1234"}, free_port=40123)
    assert "MASTER_PORT" not in launch.plan(Request(["p"], np=2), users).job.set_env  # the user's travels instead
    remote = launch.plan(Request(["p"], hosts=[Host("n1"), Host("n2")]), replace(here, gpus=1)).job
    assert "MASTER_PORT" not in remote.set_env  # rank 0 elsewhere: rankenv's default


@pytest.mark.parametrize("variable", ddlrun.SCHEDULER_JOBS)
def test_no_ssh_checks_inside_a_schedulers_allocation(variable):
    args = ddlrun._parser().parse_args(["-H", "n1,n2"])
    assert ddlrun.checks_skipped(args, {}) is None
    assert variable in ddlrun.checks_skipped(args, {variable: "42"})
    assert ddlrun.checks_skipped(ddlrun._parser().parse_args(["-s"]), {}) == "--skipchecks"


def test_elastic_asks_open_mpi_for_ulfm_and_is_refused_on_mpich():
    p = launch.plan(Request(["prog"], np=4, elastic=True, min_np=2), CPU_BOX)
    assert p.job.set_env["DDL_ELASTIC"] == "1" and p.job.set_env["DDL_ELASTIC_MIN_NP"] == "2"
    cmd, _ = mpirun.build("openmpi", "/v/bin/mpiexec", p.job, True, 2)
    assert cmd[cmd.index("--with-ft"):cmd.index("--with-ft") + 2] == ["--with-ft", "ulfm"]
    with pytest.raises(ddlrun.DDLError, match="MPICH's hydra does not offer"):
        mpirun.build("mpich", "/v/bin/mpiexec", p.job, True, 2)
    with pytest.raises(LaunchError, match="--min-np 5 is more than the 4 ranks"):
        launch.plan(Request(["prog"], np=4, elastic=True, min_np=5), CPU_BOX)
    with pytest.raises(LaunchError, match="--max-np 3 is less than the 4 ranks"):
        launch.plan(Request(["prog"], np=4, elastic=True, max_np=3), CPU_BOX)
    assert "--with-ft" not in mpirun.build("openmpi", "/v/bin/mpiexec",
                                           launch.plan(Request(["prog"], np=4), CPU_BOX).job, True, 2)[0]


def test_restart_flags_torchrun_and_horovodrun_spellings(monkeypatch, capsys):
    ap = ddlrun._parser()
    for flag in ("--max-restarts", "--reset-limit"):
        assert ap.parse_args([flag, "3"]).max_restarts == 3
    policy = ddlrun._policy(ap.parse_args(["--min-np", "2", "--max-np", "8", "--host-discovery-script", "s.sh"]))
    assert (policy.min_np, policy.max_np, policy.script, policy.max_restarts, policy.active) == (2, 8, "s.sh", 0,
                                                                                                 True)
    for argv, wanted in ((["--host-discovery-script", "s.sh", "-H", "a"], "drop -H"),
                         (["--discovery-interval", "0"], "must be positive"),
                         (["-np", "4", "--min-np", "5"], "--min-np 5 is more than the 4 ranks")):
        with pytest.raises(ddlrun.DDLError, match=wanted):
            ddlrun._policy(ap.parse_args(argv))
    # MPICH has no ULFM: with restarts an elastic job is launched again instead of refused; without, refused
    args = ap.parse_args(["--elastic", "--max-restarts", "2"])
    assert ddlrun._in_place(args, "mpich", ddlrun._policy(args)) is False
    assert "launched again" in capsys.readouterr().err
    assert ddlrun._in_place(args, "openmpi", ddlrun._policy(args)) is True
    args = ap.parse_args(["--min-np", "2"])
    assert ddlrun._in_place(args, "mpich", ddlrun._policy(args)) is True  # and mpirun.build refuses it (above)


def test_a_restart_launch_gives_every_rank_its_folder_and_count():
    p = launch.plan(Request(["prog"], np=2, job_env={"DDL_ELASTIC_STATE_DIR": "/s", "DDL_ELASTIC_RESTART": "1"}),
                    CPU_BOX)
    assert p.job.set_env["DDL_ELASTIC_STATE_DIR"] == "/s" and p.job.set_env["DDL_ELASTIC_RESTART"] == "1"
    assert "DDL_ELASTIC" not in p.job.set_env and not p.job.fault_tolerant  # restarts alone: no ULFM


def test_horovodrun_flags_become_ddls_settings(monkeypatch, capsys):
    argv = ["-np", "2", "-H", "a:1,b:1", "-p", "2222", "--network-interface", "ib0", "--timeline-filename",
            "t.json", "--fusion-threshold-mb", "32", "--cycle-time-ms", "5", "--start-timeout", "30", "--gloo",
            "--mpi", "--verbose", "python", "train.py"]
    rc, err = _dry_run(monkeypatch, capsys, argv)
    assert rc == 0, err
    line = err.strip().splitlines()[-1]
    assert "--prtemca plm_ssh_args '-p 2222'" in line and "btl_tcp_if_include ib0" in line
    assert "DDL_FUSION_BYTES=33554432" in line and "DDL_TIMELINE=/" in line and "t.json" in line
    assert line.endswith("python train.py")
    args = ddlrun._parser().parse_args(["-p", "2222", "--start-timeout", "30"])
    ssh = ddlrun._ssh(args)
    assert ssh[ssh.index("-p") + 1] == "2222" and "ConnectTimeout=30" in ssh and "ConnectTimeout=5" not in ssh
    # --mpi NAME still picks the MPI; bare, it is horovodrun's switch and the program follows
    ap = ddlrun._parser()
    assert ddlrun.split_program(ap, ["--mpi", "mpich", "python", "x.py"]) == (["--mpi=mpich"], ["python", "x.py"])
    assert ddlrun.split_program(ap, ["--mpi", "python", "x.py"]) == ([], ["python", "x.py"])
    with pytest.raises(ddlrun.DDLError, match="hydra passes no arguments to ssh"):
        mpirun.build("mpich", "/v/bin/mpiexec", mpirun.Job(["p"], 2, ["a", "b"], ssh_port=2222), False, 2)


def test_the_horovodrun_command_speaks_horovodruns_spellings(monkeypatch, capsys):
    from importlib.metadata import distribution

    from ddl.tools import horovodrun

    options, program = horovodrun.translate(
        ["--num-proc", "4", "--hosts", "a:2,b:2", "--mpi-args", "-x FOO", "--hierarchical-allreduce",
         "--log-level", "DEBUG", "--disable-cache", "--mpi", "python", "train.py", "--num-proc", "9"])
    assert options == ["-np", "4", "-H", "a:2,b:2", "--mpiarg", "-x FOO", "--mpi"]
    assert program == ["python", "train.py", "--num-proc", "9"]  # the program's own arguments untouched
    assert horovodrun.translate(["--mpi", "mpich", "-np=2", "x"]) == (["--mpi", "mpich", "-np=2"], ["x"])
    for refused, hint in (("--ssh-identity-file", "IdentityFile"), ("--autotune", "cost model"),
                          ("--jsrun", "LSF")):
        with pytest.raises(SystemExit):
            horovodrun.translate([refused, "python", "t.py"])
        assert refused in (err := capsys.readouterr().err) and hint in err
    # the whole path: horovodrun's line becomes ddlrun's command
    monkeypatch.setenv("DDL_MPIEXEC", "/v/bin/mpiexec")
    monkeypatch.setattr(mpirun, "flavor", lambda exe: "openmpi")
    monkeypatch.setattr(ddlrun, "_machine", lambda: CPU_BOX)
    assert horovodrun.main(["--dry-run", "--num-proc", "2", "--verbose", "--no-stall-check", "--mpi", "python",
                            "t.py"]) == 0
    err = capsys.readouterr().err
    assert "--no-stall-check accepted: ddl has no stall checker" in err
    line = err.strip().splitlines()[-1]
    assert " -n 2 " in line and line.endswith(" ".join(SHIM) + " python t.py")
    # the command ships only with the extra: ddl itself installs no horovodrun
    assert "horovodrun" not in {e.name for e in distribution("ddl").entry_points}
    assert 'horovod = ["ddl-horovodrun"]' in open(_repo_file("pyproject.toml")).read()
    assert 'horovodrun = "ddl.tools.horovodrun:main"' in open(_repo_file("extras/horovodrun/pyproject.toml")).read()


def _repo_file(name: str) -> str:
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", name)
