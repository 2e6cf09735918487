"""AlterPartitionSender: the ISR proposals of one turn of the event loop go to the controller
in one AlterPartition, and each partition's core gets its own answer."""

import asyncio
from types import SimpleNamespace

from tidewater.broker.controller_link.alter_partition import AlterPartitionSender
from tidewater.broker.replication.ready import AlterPartitionRequest
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb


class Supervisor:
    def __init__(self) -> None:
        self.tasks: list[asyncio.Task] = []

    def spawn(self, coro, name: str = "") -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.append(task)
        return task


class Core:
    """A partition's replication core: records what the sender handed it."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, int, object]] = []
        self.unsure: list[int] = []

    def on_alter_partition_answer(self, alter_id, error, state, now_ms):
        self.answers.append((alter_id, error, state))
        return ("ready", alter_id)

    def on_alter_partition_unsure(self, alter_id, now_ms):
        self.unsure.append(alter_id)
        return ("unsure", alter_id)


def partition(n: int):
    return SimpleNamespace(tp=TopicPartition("t", n), replica=Core())


def request(alter_id: int) -> AlterPartitionRequest:
    return AlterPartitionRequest(alter_id=alter_id, leader_epoch=1, partition_epoch=2,
                                 new_isr=(1, 2), broker_epochs=(5, 6))


def run(answer):
    """Three proposals in one turn, then one later; ``answer(items)``: the controller's."""
    calls: list[list[pb.AlterPartitionItem]] = []
    applied: list[tuple[int, object]] = []

    async def rpc(items):
        calls.append(list(items))
        return answer(items)

    async def main():
        supervisor = Supervisor()
        carrier = SimpleNamespace(apply=lambda p, ready: applied.append((p.tp.partition, ready)))
        sender = AlterPartitionSender(rpc=rpc, carrier=carrier, supervisor=supervisor)
        parts = [partition(n) for n in range(4)]
        for n in range(3):
            sender.send(parts[n], request(10 + n))
        await asyncio.sleep(0.01)
        sender.send(parts[3], request(13))
        while not all(t.done() for t in supervisor.tasks):
            await asyncio.gather(*supervisor.tasks)
        return parts

    parts = asyncio.run(main())
    return calls, applied, parts


def test_proposals_of_one_turn_share_a_request_and_each_gets_its_result():
    def answer(items):
        return pb.AlterPartitionResponse(error_code=pb.NONE, items=[
            pb.AlterPartitionResult(
                error_code=pb.NONE if i.partition != 1 else pb.FENCED_LEADER_EPOCH,
                state=pb.PartitionState(topic=i.topic, partition=i.partition, leader=1,
                                        leader_epoch=1, partition_epoch=3,
                                        replicas=[1, 2], isr=list(i.new_isr)))
            for i in items])

    calls, applied, parts = run(answer)
    assert [[i.partition for i in c] for c in calls] == [[0, 1, 2], [3]]
    assert sorted(applied) == [(n, ("ready", 10 + n)) for n in range(4)]
    assert parts[1].replica.answers[0][:2] == (11, pb.FENCED_LEADER_EPOCH)
    assert parts[2].replica.answers[0][2].partition == 2  # its own state, not the first's


def test_a_request_level_error_leaves_every_partition_unsure():
    calls, applied, parts = run(
        lambda items: pb.AlterPartitionResponse(error_code=pb.STALE_BROKER_EPOCH))
    assert [p.replica.unsure for p in parts] == [[10], [11], [12], [13]]
    assert all(ready[0] == "unsure" for _n, ready in applied)
