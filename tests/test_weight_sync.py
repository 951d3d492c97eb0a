"""The weight-sync group: buckets, broadcasts (gloo, two threads), where its store listens."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import threading

import pytest
import torch

from agentgym.sync.collective import (
    GroupAddress,
    SyncGroup,
    TensorMeta,
    plan_buckets,
    serve_store,
)

SIOCGIFADDR = 0x8915


def non_loopback_ipv4() -> str | None:
    """An IPv4 address this machine holds on an interface other than loopback, if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
            address = socket.inet_ntoa(reply[20:24])
            if not ipaddress.ip_address(address).is_loopback:
                return address
    return None


def _meta(name: str, numel: int, dtype=torch.float32) -> TensorMeta:
    return TensorMeta(name, (numel,), dtype)


def test_buckets_are_runs_of_one_dtype_cut_at_the_byte_limit():
    metas = [_meta("a", 10), _meta("b", 10), _meta("c", 10),  # 40 bytes each
             _meta("d", 5, torch.bfloat16), _meta("e", 100), _meta("f", 1)]  # fmt: skip
    # a+b fit 80 bytes, c starts a new bucket; d changes dtype; e (400 bytes) goes alone
    assert plan_buckets(metas, limit=80) == [[0, 1], [2], [3], [4], [5]]
    assert plan_buckets(metas, limit=10**6) == [[0, 1, 2], [3], [4, 5]]
    assert plan_buckets([], limit=80) == []


def test_a_broadcast_gives_the_receiver_every_tensor_exactly_bucket_by_bucket():
    generator = torch.Generator().manual_seed(0)
    tensors = [
        ("w1", torch.randn(3, 4, generator=generator)),
        ("w2", torch.randn(5, generator=generator)),
        ("half", torch.randn(2, 3, generator=generator).to(torch.bfloat16)),
        ("big", torch.randn(64, generator=generator)),
        ("view", torch.randn(4, 6, generator=generator).t()),  # not contiguous
    ]
    store = serve_store("127.0.0.1")
    address = GroupAddress("127.0.0.1", store.port, 2, "gloo", generation=1, bucket_bytes=64)
    metas = [TensorMeta(n, tuple(t.shape), t.dtype) for n, t in tensors]
    received, buckets, errors = {}, [], []

    def receiver():
        try:
            group = SyncGroup(address, 1, "127.0.0.1", torch.device("cpu"))
            for bucket in group.receive(metas):
                buckets.append([n for n, _ in bucket])
                received.update((n, t.clone()) for n, t in bucket)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    thread = threading.Thread(target=receiver)
    thread.start()
    sender = SyncGroup(address, 0, "127.0.0.1", torch.device("cpu"), store=store)
    sender.send(tensors)
    thread.join(timeout=60)
    assert not errors and not thread.is_alive()
    assert buckets == [["w1"], ["w2"], ["half"], ["big"], ["view"]]  # 64 bytes: w1 is 48
    for name, t in tensors:
        assert received[name].dtype == t.dtype and torch.equal(received[name], t), name


def test_an_aborted_sender_makes_a_waiting_receiver_fail_at_once():
    store = serve_store("127.0.0.1")
    address = GroupAddress("127.0.0.1", store.port, 2, "gloo", generation=2)
    errors = []

    def receiver():
        group = SyncGroup(address, 1, "127.0.0.1", torch.device("cpu"))
        try:
            list(group.receive([_meta("a", 4)]))
        except RuntimeError as err:
            errors.append(err)

    thread = threading.Thread(target=receiver)
    thread.start()
    sender = SyncGroup(address, 0, "127.0.0.1", torch.device("cpu"), store=store)
    sender.abort()
    thread.join(timeout=30)  # well under the group's timeout (GROUP_TIMEOUT_S)
    assert not thread.is_alive()
    assert len(errors) == 1


@pytest.mark.parametrize("served", ["loopback", "outside"])
def test_the_store_listens_on_the_address_it_is_given_only(served):
    # It is unauthenticated: on every interface, any host that reaches the port could
    # write the group's keys.
    outside = non_loopback_ipv4()
    if outside is None:
        pytest.skip("this machine has no IPv4 address but loopback's to connect to")
    host, other = ("127.0.0.1", outside) if served == "loopback" else (outside, "127.0.0.1")
    store = serve_store(host)
    with socket.create_connection((host, store.port), timeout=2):
        pass  # the store is there
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((other, store.port), timeout=2).close()
