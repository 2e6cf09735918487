"""`make demo`: a 3-broker cluster loses a partition leader and no acknowledged record is lost.

Steps: start a local cluster (a quorum of 3 controllers, as ``tide cluster up``
gives by default, + 3 brokers), create a topic with 3
partitions, replication factor 3 and min.insync.replicas 2; produce with
acks=all; SIGKILL the leader of partition 0; keep producing; consume every
partition from the start and check that every acknowledged record is there
exactly once, at the offset it was acknowledged with, and that a consumer
reading live through the whole failover saw every one of them once; restart
the killed broker and wait until it is back in every ISR; stop the cluster.

To make "exactly once" checkable the producer does not retry by itself
(``retries=0``): a record whose send failed is sent again by this script as a
new attempt with its own value, so every value is sent at most once. A failed
attempt may still be in the log (the leader wrote it but died before
answering); the story counts those as "in doubt", they are not duplicates.

Usage: ``python -m tidewater.tools.demo --data-dir .demo [--records N] [--controllers N]
[--base-port P] [--keep]``.
Exit status 0 on PASS, 1 on FAIL.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tidewater.proto import grpc_env
from tidewater.proto.malloc_tuning import tune_malloc_for_large_buffers

# The demo's clients run as the brokers run (proto/grpc_env.py), before grpc is imported.
grpc_env.apply()
# MiB-sized produce requests and fetch answers stay off per-call mmap (proto/malloc_tuning.py).
tune_malloc_for_large_buffers()

from tidewater.client.admin import AdminClient  # noqa: E402
from tidewater.client.consumer import Consumer, ConsumerRecord, offsets_of_every  # noqa: E402
from tidewater.client.metadata import TopicPartition  # noqa: E402
from tidewater.client.producer import Producer, RecordFuture  # noqa: E402
from tidewater.proto.errors import TidewaterError  # noqa: E402
from tidewater.tools.local_cluster import MANIFEST_NAME, LocalCluster, LocalClusterError  # noqa: E402

TOPIC = "demo-events"
PARTITIONS = 3
SEND_ROUNDS_MAX = 60


def say(text: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {text}", flush=True)


class Ledger:
    """Every attempt sent and what became of it."""

    def __init__(self) -> None:
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.failed_attempts: list[bytes] = []
        self.attempts = 0
        self.errors: Counter[str] = Counter()


def value_examples(values: Sequence[bytes | None], count: int = 5) -> str:
    """The first ``count`` record values, for a line of the story (a record read back
    may have a null value: no one here sent it, and the story says so)."""
    return ", ".join("null" if v is None else v.decode(errors="replace") for v in values[:count])


def produce_round(producer: Producer, ledger: Ledger, first: int, count: int) -> None:
    """Send records first..first+count-1; resend failed ones as new attempts until acknowledged."""
    pending = list(range(first, first + count))
    attempt = 0
    while pending:
        attempt += 1
        if attempt > SEND_ROUNDS_MAX:
            raise RuntimeError(f"{len(pending)} records still unacknowledged after {SEND_ROUNDS_MAX} rounds")
        sent: list[tuple[int, bytes, RecordFuture | None]] = []  # None: send raised
        for seq in pending:
            value = f"record-{seq:06d}-attempt-{attempt}".encode()
            key = f"key-{seq % 97}".encode()
            ledger.attempts += 1
            try:
                sent.append((seq, value, producer.send(TOPIC, value, key=key)))
            except TidewaterError as e:
                ledger.errors[e.error_name] += 1
                ledger.failed_attempts.append(value)
                sent.append((seq, value, None))
        try:
            producer.flush(60)
        except TidewaterError:
            pass
        retry = []
        for seq, value, fut in sent:
            exc = fut.exception() if fut is not None else None
            if fut is not None and exc is None:
                meta = fut.result()
                ledger.acked[value] = (meta.partition, meta.offset)
            else:
                if fut is not None:
                    ledger.errors[getattr(exc, "error_name", type(exc).__name__)] += 1
                    ledger.failed_attempts.append(value)
                retry.append(seq)
        pending = retry
        if pending:
            time.sleep(0.3)


def consume_everything(bootstrap: str, timeout_s: float = 60) -> list[ConsumerRecord]:
    """Every record of every partition, from the log start up to the current high watermark."""
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        deadline = time.monotonic() + timeout_s
        ends, missing = offsets_of_every(consumer.end_offsets,
                                         [TopicPartition(*tp) for tp in tps], deadline, 0.1)
        if missing:
            raise RuntimeError("could not read the end offsets of every partition")
        records: list[ConsumerRecord] = []
        while any(consumer.position(tp) < ends[tp] for tp in ends):
            records += consumer.poll(500)
            if time.monotonic() > deadline:
                raise RuntimeError("timed out consuming the topic back")
        return records


class TailingConsumer:
    """Reads every partition from the start in a thread for the whole story, through the
    leader failover, so the story can say what a live reader saw."""

    def __init__(self, bootstrap: str):
        self.consumer = Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100)
        self.consumer.assign([(TOPIC, p) for p in range(PARTITIONS)])
        self.consumer.seek_to_beginning()
        self.records: list[ConsumerRecord] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-tail", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.records.extend(self.consumer.poll(200))
        except BaseException as e:  # reported by the story
            self.error = e

    def wait_for(self, values: set[bytes], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.error is None:
            if values <= {r.value for r in self.records}:
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.consumer.close()


def wait_for_full_isr(admin: AdminClient, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            topic = admin.describe_topics([TOPIC], with_replica_state=False)[0]
            if all(len(p.isr) == len(p.replicas) for p in topic.partitions):
                return True
        except TidewaterError:
            pass
        time.sleep(0.5)
    return False


def reset_dir(data_dir: Path) -> None:
    """Stop a previous demo cluster in ``data_dir`` and remove its files (only the cluster layout)."""
    if (data_dir / MANIFEST_NAME).exists():
        try:
            LocalCluster(data_dir).down(timeout_s=5)
        except LocalClusterError:
            pass
    if not data_dir.exists():
        return
    for entry in data_dir.iterdir():
        if entry.name in (MANIFEST_NAME,) or entry.name.startswith(("controller", "broker-")):
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def run(data_dir: Path, records: int, base_port: int, keep: bool, controllers: int = 3) -> bool:
    reset_dir(data_dir)
    cluster = LocalCluster(data_dir)
    say(f"starting {'a controller' if controllers == 1 else f'{controllers} controllers'} "
        f"and 3 brokers in {data_dir} ...")
    started = time.monotonic()
    bootstrap = cluster.up(3, base_port=base_port, controllers=controllers)
    say(f"cluster serving after {time.monotonic() - started:.1f} s; bootstrap {bootstrap}")
    ok = False
    try:
        ok = _story(cluster, bootstrap, records)
    finally:
        if keep:
            say(f"--keep: cluster left running (tide cluster down --data-dir {data_dir})")
        else:
            cluster.down()
            say("cluster stopped")
    return ok


def _story(cluster: LocalCluster, bootstrap: str, records: int) -> bool:
    admin = AdminClient(bootstrap)
    admin.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
    say(f"created topic {TOPIC}: {PARTITIONS} partitions, replication factor 3, min.insync.replicas 2")
    wait_for_full_isr(admin, 15)

    tail = TailingConsumer(bootstrap)
    try:
        return _produce_kill_check(cluster, admin, bootstrap, records, tail)
    finally:
        tail.stop()
        admin.close()


def _produce_kill_check(cluster: LocalCluster, admin: AdminClient, bootstrap: str, records: int,
                        tail: TailingConsumer) -> bool:
    ledger = Ledger()
    half = records // 2
    producer = Producer(bootstrap, acks="all", retries=0, linger_ms=5,
                        request_timeout_ms=10000, delivery_timeout_ms=30000)
    try:
        t0 = time.monotonic()
        produce_round(producer, ledger, 0, half)
        say(f"produced {half} records with acks=all in {time.monotonic() - t0:.1f} s")

        topic = admin.describe_topics([TOPIC], with_replica_state=False)[0]
        victim_partition = topic.partitions[0]
        victim = victim_partition.leader
        led = [p.partition for p in topic.partitions if p.leader == victim]
        say(f"partition 0 leader is broker {victim} (epoch {victim_partition.leader_epoch}, "
            f"ISR {list(victim_partition.isr)}); it leads partitions {led}")
        cluster.kill(victim, "KILL")
        killed_at = time.monotonic()
        say(f"SIGKILLed broker {victim}; producing {records - half} more records meanwhile")

        produce_round(producer, ledger, half, records - half)
        say(f"second half acknowledged {time.monotonic() - killed_at:.1f} s after the kill; "
            f"{ledger.attempts} sends for {records} records, failed sends: "
            + (", ".join(f"{n} x{c}" for n, c in ledger.errors.most_common()) or "none"))
    finally:
        producer.close()

    topic = admin.describe_topics([TOPIC], with_replica_state=False)[0]
    for p in topic.partitions:
        say(f"  partition {p.partition}: leader {p.leader} epoch {p.leader_epoch} ISR {list(p.isr)}")

    t0 = time.monotonic()
    consumed = consume_everything(bootstrap)
    say(f"consumed {len(consumed)} records back from all partitions in {time.monotonic() - t0:.1f} s")

    counts = Counter(r.value for r in consumed)
    where = {r.value: (r.partition, r.offset) for r in consumed}
    missing = [v for v in ledger.acked if counts[v] == 0]
    duplicated = [v for v, c in counts.items() if c > 1]
    misplaced = [v for v, pos in ledger.acked.items() if counts[v] == 1 and where[v] != pos]
    sent_values = set(ledger.acked) | set(ledger.failed_attempts)
    in_doubt = sum(1 for v in ledger.failed_attempts if counts[v] > 0)
    unknown = [v for v in counts if v not in sent_values]
    say(f"acknowledged {len(ledger.acked)}; missing {len(missing)}; duplicated {len(duplicated)}; "
        f"at another offset than acknowledged {len(misplaced)}; unacknowledged attempts found in the "
        f"log (in doubt, not duplicates) {in_doubt}; records nobody sent {len(unknown)}")
    tail_complete = tail.wait_for(set(ledger.acked), 30)
    tail_counts = Counter(r.value for r in tail.records)
    tail_duplicated = [v for v, c in tail_counts.items() if c > 1]
    say(f"a consumer reading live through the failover saw {len(tail.records)} records: "
        + ("every acknowledged one" if tail_complete else "NOT every acknowledged one")
        + f", {len(tail_duplicated)} twice" + (f" (error: {tail.error})" if tail.error else ""))

    say(f"restarting broker {victim} ...")
    t0 = time.monotonic()
    cluster.start(victim)
    back = wait_for_full_isr(admin, 30)
    say(f"broker {victim} serving again; "
        + (f"back in every ISR after {time.monotonic() - t0:.1f} s" if back else "NOT back in every ISR within 30 s"))
    try:
        for p in admin.describe_topics([TOPIC])[0].partitions:
            replicas = ", ".join(f"broker {r.broker} LEO {r.log_end_offset} HW {r.high_watermark}"
                                 for r in p.replicas_state)
            say(f"  partition {p.partition} (leader {p.leader}, epoch {p.leader_epoch}): {replicas}")
    except TidewaterError as e:
        say(f"  could not describe replicas: {e}")

    passed = (len(ledger.acked) == records and not missing and not duplicated
              and not misplaced and not unknown and tail_complete and not tail_duplicated)
    for label, values in (("missing", missing), ("duplicated", duplicated), ("misplaced", misplaced),
                          ("unknown", unknown)):
        if values:
            say(f"{label} examples: " + value_examples(values))
    print(("PASS" if passed else "FAIL") + f": {len(ledger.acked)} acknowledged records, "
          f"{len(missing)} missing, {len(duplicated)} duplicated after killing leader broker {victim}; "
          f"live consumer saw {'all' if tail_complete else 'NOT all'} of them",
          flush=True)
    return passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidewater.tools.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=".demo")
    parser.add_argument("--records", type=int, default=4000, help="records to produce in total")
    parser.add_argument("--base-port", type=int, default=0,
                        help="broker ports BASE.. (controller BASE-1); default 0: free ports")
    parser.add_argument("--controllers", type=int, default=3,
                        help="controllers in the quorum (1: a single controller)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    args = parser.parse_args(argv)
    try:
        ok = run(Path(args.data_dir).resolve(), args.records, args.base_port, args.keep,
                 args.controllers)
    except (LocalClusterError, TidewaterError, RuntimeError) as e:
        print(f"FAIL: {e}", flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
