"""alltoall: the pairwise exchange's programs (simulated message by message) and Communicator.alltoall over the
loopback transport (ranks are threads, the real executor), against numpy."""
import numpy as np
import pytest

from ddl import DDLError
from ddl.schedule.alltoall import pairwise_exchange
from ddl.schedule.ir import Op

from test_loopback import run_ok, spawn


def table_for(p: int, seed: int) -> np.ndarray:
    """rows[i][j]: rows rank i sends rank j (zeros included)."""
    return np.random.default_rng(seed).integers(0, 4, size=(p, p))


def rows_of(i: int, j: int, n: int, width: int = 2) -> np.ndarray:
    """The rows rank i sends rank j: values that name both."""
    return (np.full((n, width), 1000 * i + j) + np.arange(width)).astype(np.int64)


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_the_exchange_delivers_every_pairs_bytes_once(p):
    rows = table_for(p, p)
    buffers, programs = [], []
    for r in range(p):  # input then output, one element per row
        sent = np.concatenate([[0], np.cumsum(rows[r])])
        got = np.concatenate([[0], np.cumsum(rows[:, r])])
        base = int(sent[-1])
        data = np.concatenate([np.full(rows[r][j], 1000 * r + j) for j in range(p)] + [np.full(int(got[-1]), -1)])
        buffers.append(data)
        programs.append(pairwise_exchange(r, [(int(sent[j]), int(rows[r][j])) for j in range(p)],
                                          [(base + int(got[j]), int(rows[j][r])) for j in range(p)]))
    assert all(pr.rounds == max(p - 1, 0) for pr in programs)
    for k in range(max(p - 1, 0)):  # round by round: each send meets the receive its peer posted for it
        sends = {(pr.rank, s.peer): s for pr in programs for s in pr.steps if s.round == k and s.op is Op.SEND}
        recvs = {(s.peer, pr.rank): s for pr in programs for s in pr.steps if s.round == k and s.op is Op.RECV_COPY}
        assert sends.keys() == recvs.keys()
        for (a, b), s in sends.items():
            r = recvs[(a, b)]
            assert s.count == r.count and s.tag == r.tag
            buffers[b][r.offset:r.offset + r.count] = buffers[a][s.offset:s.offset + s.count]
    for r in range(p):
        base = int(rows[r].sum())
        want = np.concatenate([np.full(rows[i][r], 1000 * i + r) for i in range(p)] + [[]])
        got = buffers[r][base:]
        others = np.concatenate([np.full(rows[i][r], i != r) for i in range(p)] + [[]]).astype(bool)
        np.testing.assert_array_equal(got[others], want[others])  # its own rows are the caller's to copy


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("told", [False, True])
def test_alltoall_gives_each_rank_what_every_rank_sent_it(p, told):
    rows = table_for(p, 10 + p)

    def job(comm):
        r = comm.rank
        mine = np.concatenate([rows_of(r, j, rows[r][j]) for j in range(p)])
        return comm.alltoall(mine, rows[r].tolist(), rows[:, r].tolist() if told else None)

    for r, got in enumerate(run_ok(p, job)):
        np.testing.assert_array_equal(got, np.concatenate([rows_of(i, r, rows[i][r]) for i in range(p)]))


def test_equal_parts_by_default_and_any_dtype():
    def job(comm):  # row k of rank r holds 10 r + k; rows 2j and 2j + 1 go to rank j
        return comm.alltoall((np.arange(6, dtype=np.float16) + 10 * comm.rank).reshape(6, 1))

    for r, got in enumerate(run_ok(3, job)):
        want = [[[10 * i + 2 * r], [10 * i + 2 * r + 1]] for i in range(3)]
        np.testing.assert_array_equal(got, np.concatenate(want).astype(np.float16))


def test_bad_rows_are_refused_on_every_rank_naming_the_call():
    def job(comm):
        send = [1, 1] if comm.rank else [2, 2]  # rank 0's add up to 4, its array has 2 rows
        return comm.alltoall(np.zeros((2, 1)), send)

    _, errors = spawn(2, job)
    assert all(isinstance(e, DDLError) and "alltoall" in str(e) for e in errors), errors
