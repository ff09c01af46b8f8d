"""A parameter server (``--dp-mode ps[:S]``): truly asynchronous data parallelism.

Every data-parallel rank is a *worker*: it computes the gradient of its share of a batch
on the parameters it last pulled, pushes it to the server and pulls the server's current
parameters back — with no barrier between workers (Dean et al. 2012, "Large scale
distributed deep networks", Downpour SGD; Li et al. 2014, "Scaling distributed machine
learning with the parameter server"). The server applies each push as it arrives, with
the job's optimizer (AdamW) over its own copy of the parameters, so a fast worker applies
more updates than a slow one and nobody waits for a straggler.

The *staleness* of a pushed gradient is the number of other workers' updates applied
between its pull and its push; every reply carries it, and the server keeps the
distribution. ``ps:S`` bounds the workers' clocks as stale synchronous parallel does
(Ho et al. 2013): a worker that has pushed more than S times beyond the slowest running
worker gets its reply only when that worker catches up. ``ps`` alone is unbounded.

The job's work is counted in pushes: the run ends when the server has applied
``steps × dp`` of them (the samples of ``steps`` synchronous steps); pushes that arrive
after are discarded and answered with *stop* and the final parameters, so every worker
ends with the same model.

Where the server runs: a thread of data-parallel rank 0, beside that rank's own worker
(which talks to it through in-process queues), with a receiving thread blocked on a
point-to-point receive from any source of a group of its own — the main threads' other
collectives (evaluation, start-up) are on other groups and never wait for it.

Messages (float32, one tensor each way, sized by this rank's gradient of numel n):
push ``[kind, version seen, g_1 … g_n]`` (kind 1: a gradient, 0: the worker leaves) and
reply ``[go, version, staleness, lr, grad norm, θ_1 … θ_n]``.
"""

from __future__ import annotations

import inspect
import queue
import threading
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from paracube.comm import ops
from paracube.comm.ledger import CommLedger
from paracube.data_parallel.optimizer import MainParamOptimizer

PUSH_HEAD, REPLY_HEAD = 2, 5  # header floats of each message
GRADIENT, LEAVE = 1.0, 0.0  # push kinds


class Reply(NamedTuple):
    go: bool  # False: the job's pushes are done; the parameters are the final ones
    version: int  # updates the server has applied, after this worker's
    staleness: int  # other workers' updates between this worker's pull and its push
    lr: float
    grad_norm: float


class ParameterServer:
    """The server: its own copy of the main parameters and an optimizer over them.

    ``optimizer``: the worker's :class:`MainParamOptimizer` on this rank (the initial
    values, the parameter groups and the optimizer's kind and settings are copied from
    it). ``lr_at(update)``: the learning rate of an update; ``clip``: the gradient-norm
    limit per push (None: no clipping); ``total``: pushes to apply before stopping.
    """

    def __init__(
        self,
        optimizer: MainParamOptimizer,
        workers: list[int],
        group,
        total: int,
        lr_at: Callable[[int], float],
        clip: float | None,
        staleness_bound: int | None,
    ) -> None:
        self.workers, self.group, self.total = workers, group, total
        self.lr_at, self.clip, self.bound = lr_at, clip, staleness_bound
        self.local = workers[0]  # the worker in this process (group rank 0)
        mains = [main for _, main, _ in optimizer.held()]
        self.params = torch.cat([m.detach().reshape(-1) for m in mains]).clone()  # (n,)
        self.grad = torch.zeros_like(self.params)
        self._optimizer = _mirror(optimizer, self.params, self.grad)
        self.version = 0  # updates applied
        self.clock = dict.fromkeys(workers, 0)  # pushes applied per worker
        self.running = set(workers)  # workers not yet told to stop
        self.held: dict[int, tuple[int, float, float]] = {}  # worker → (staleness, lr, norm)
        self.staleness = Counter[int]()  # the distribution over applied pushes
        # per applied push: (worker, its local step, the version it computed on, the
        # slowest other running worker's pushes then) — enough to replay the run serially
        self.log: list[tuple[int, int, int, int]] = []
        self.inbox: queue.Queue = queue.Queue()  # (worker, push) from both sources
        self.local_replies: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._serve, name="paracube-ps", daemon=True),
            threading.Thread(target=self._receive, name="paracube-ps-recv", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # -- threads ------------------------------------------------------------------------------

    def _receive(self) -> None:
        """Remote pushes into the inbox, until every remote worker has left."""
        remote = len(self.workers) - 1
        buffer = torch.empty(PUSH_HEAD + self.params.numel())
        try:
            while remote:
                work = dist.irecv(buffer, src=None, group=self.group)  # from any worker
                assert work is not None  # this rank is in the group
                work.wait()
                push = buffer.clone()
                if push[0].item() == LEAVE:
                    remote -= 1
                else:
                    self.inbox.put((work._source_rank(), push))  # its group rank
        except BaseException as e:  # noqa: BLE001 — surfaced to the local worker
            self._fail(e)

    def _serve(self) -> None:
        try:
            while self.running:
                worker, push = self.inbox.get()
                self._apply(worker, push)
        except BaseException as e:  # noqa: BLE001 — surfaced to the local worker
            self._fail(e)

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self.local_replies.put(None)

    # -- the server's work -----------------------------------------------------------------

    @torch.no_grad()
    def _apply(self, worker: int, push: torch.Tensor) -> None:
        if self.version >= self.total:  # late: the job's pushes are all applied
            self._reply(worker, 0, self.lr_at(self.version), 0.0)
            return
        seen = int(push[1].item())
        self.grad.copy_(push[PUSH_HEAD:])
        norm = float(self.grad.norm())
        if self.clip is not None and norm > self.clip:
            self.grad.mul_(self.clip / (norm + 1e-6))
        lr = self.lr_at(self.version)
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.step()
        staleness = self.version - seen
        others = [self.clock[w] for w in self.running if w != worker]
        self.log.append((worker, self.clock[worker], seen, min(others, default=-1)))
        self.version += 1
        self.clock[worker] += 1
        self.staleness[staleness] += 1
        self.held[worker] = (staleness, lr, norm)
        self._release()

    def _release(self) -> None:
        """Answer every held worker allowed to go on (all of them once the work is done)."""
        done = self.version >= self.total
        slowest = min(self.clock[w] for w in self.running)
        for worker in list(self.held):
            ahead = self.bound is not None and self.clock[worker] > slowest + self.bound
            if done or not ahead:
                self._reply(worker, *self.held.pop(worker))

    def _reply(self, worker: int, staleness: int, lr: float, norm: float) -> None:
        go = self.version < self.total
        head = [float(go), float(self.version), float(staleness), lr, norm]
        reply = torch.cat([torch.tensor(head), self.params])
        if not go:
            self.running.discard(worker)
        if worker == self.local:
            self.local_replies.put(reply)
        else:
            dist.send(reply, group=self.group, group_dst=worker)

    def memory_bytes(self) -> int:
        """The server's bytes: its parameters, a gradient and the optimizer's states."""
        states = sum(
            t.numel() * t.element_size()
            for st in self._optimizer.state.values()
            for t in st.values()
            if torch.is_tensor(t) and t.dim() > 0
        )
        return 2 * self.params.numel() * self.params.element_size() + states

    def join(self) -> None:
        for t in self._threads:
            t.join()
        if self.error is not None:
            raise self.error


class Worker:
    """One data-parallel rank's side: push this step's gradient, pull the parameters.

    The server is a thread of the group's rank 0; ``server`` is that object on rank 0
    (None on the other ranks, which reach it through ``group``).
    """

    def __init__(
        self,
        optimizer: MainParamOptimizer,
        group,
        server: ParameterServer | None,
        ledger: CommLedger,
    ) -> None:
        self.optimizer, self.group, self.ledger = optimizer, group, ledger
        self.server = server
        self.mains = [main for _, main, _ in optimizer.held()]
        numel = sum(m.numel() for m in self.mains)
        self.push = torch.zeros(PUSH_HEAD + numel)
        self.reply = torch.zeros(REPLY_HEAD + numel)
        self.version = 0  # the version of the parameters this worker computes on
        self.stopped = False

    @torch.no_grad()
    def exchange(self) -> Reply:
        """Push the reduced (here: this rank's own) gradient, pull the new parameters
        into the model; blocks while the staleness bound holds this worker back."""
        grads = self.optimizer.prepare_grads()
        self.push[0], self.push[1] = GRADIENT, self.version
        torch.cat([g.reshape(-1) for g in grads], out=self.push[PUSH_HEAD:])
        self._send(self.push)
        self._receive()
        head = self.reply[:REPLY_HEAD].tolist()
        reply = Reply(bool(head[0]), int(head[1]), int(head[2]), head[3], head[4])
        at = REPLY_HEAD
        for main in self.mains:
            main.copy_(self.reply[at : at + main.numel()].view_as(main))
            at += main.numel()
        self.optimizer.publish()
        self.version = reply.version
        if not reply.go:
            self.stopped = True
            if self.server is None:
                self.push[0] = LEAVE
                self._send(self.push)
        return reply

    def _send(self, push: torch.Tensor) -> None:
        if self.server is not None:
            self.server.inbox.put((self.server.local, push.clone()))
        else:
            ops.send(push, 0, self.group, self.ledger, tag="ps_push")

    def _receive(self) -> None:
        if self.server is not None:
            reply = self.server.local_replies.get()
            if reply is None:
                self.server.join()  # raises the server's error
            self.reply.copy_(reply)
        else:
            ops.recv(self.reply, 0, self.group, self.ledger, tag="ps_pull")

    def finish(self) -> None:
        """After the last exchange: the server's threads end (rank 0 waits for them)."""
        if self.server is not None:
            self.server.join()


def _mirror(
    optimizer: MainParamOptimizer, params: torch.Tensor, grad: torch.Tensor
) -> torch.optim.Optimizer:
    """An optimizer of the worker's kind and settings over ``params`` (n,), whose
    parameters are views at the worker's offsets, each in the worker's group."""
    inner = optimizer.optimizer
    group_of = {id(p): i for i, g in enumerate(inner.param_groups) for p in g["params"]}
    groups: list[list[torch.nn.Parameter]] = [[] for _ in inner.param_groups]
    offset = 0
    for _, main, entries in optimizer.held():
        for p, a, b in entries:
            view = torch.nn.Parameter(params[offset + a : offset + b])
            view.grad = grad[offset + a : offset + b]
            groups[group_of[id(p)]].append(view)
        offset += main.numel()
    settings = [{k: v for k, v in g.items() if k != "params"} for g in inner.param_groups]
    accepted = inspect.signature(type(inner)).parameters  # defaults the class takes back
    defaults = {k: v for k, v in inner.defaults.items() if k in accepted}
    return type(inner)([{**s, "params": ps} for s, ps in zip(settings, groups) if ps], **defaults)


def connect(
    optimizer: MainParamOptimizer,
    group,
    ledger: CommLedger,
    total: int,
    lr_at: Callable[[int], float],
    clip: float | None,
    staleness_bound: int | None,
) -> Worker:
    """This rank's worker; on the group's rank 0 the server starts first, beside it."""
    server = None
    if dist.get_rank(group) == 0:
        workers = list(range(ops.group_size(group)))
        server = ParameterServer(optimizer, workers, group, total, lr_at, clip, staleness_bound)
    return Worker(optimizer, group, server, ledger)
