#!/usr/bin/env python3
"""Writes the seed corpus of control_message_fuzz: a few signed messages.

Independent of the C++ code on purpose: it is also a second implementation of
the wire format (docs/protocol.md), signed with the fuzzer's secret.

  python3 tests/fuzz/make_corpus.py tests/fuzz/corpus/control_message
"""
import hashlib
import hmac
import json
import os
import sys

SECRET = b"malle-fuzz-secret-0123456789abcdef"
CONTEXT = b"malle-control-mac-v1\n"
TS = 1700000000.25


def sign(msg_type, sender, seq, body, ts=TS):
    envelope = {"v": 1, "type": msg_type, "sender": sender, "seq": seq, "ts": ts, "body": body}
    data = json.dumps(envelope, separators=(",", ":"), ensure_ascii=True).encode()
    mac = hmac.new(SECRET, CONTEXT + data, hashlib.sha256).hexdigest()
    return data + b" " + mac.encode()


MESSAGES = {
    "node_register": sign("node_register", "agent-n1", 1,
                          {"node": "n1", "agent": "agent-n1", "node_class": {"group": "a100", "speed": 1.5},
                           "idle_until": 1700003600.5, "slots": 2}),
    "node_reclaim": sign("node_reclaim", "agent-n1", 2, {"node": "n1", "grace_s": 30, "reason": "slurm"}),
    "node_leave": sign("node_leave", "agent-n1", 3, {"node": "n1", "reason": "bye \u00e4"}),
    "agent_heartbeat": sign("agent_heartbeat", "agent-n1", 4,
                            {"node": "n1", "running": {"job": "j1", "member": "m0", "pid": 4242,
                                                         "phase": "starting",
                                                         "phase_since": 1700000000.25}}),
    "rank_exit": sign("rank_exit", "agent-n1", 5,
                      {"node": "n1", "job": "j1", "member": "m0", "exit_code": 0, "signal": 9,
                       "cause": "stopped"}),
    "job_submit": sign("job_submit", "cli.user", 1,
                       {"job": "j1", "command": ["/usr/bin/python3", "train.py", "--lr=0.1"],
                        "env": {"OMP_NUM_THREADS": "4"}, "cwd": "/home/u", "min_nodes": 1,
                        "max_nodes": 8, "logical_workers": 8, "weight": 2, "priority": -1}),
    "job_cancel": sign("job_cancel", "cli.user", 2, {"job": "j1", "reason": "user"}),
    "advisor_report": sign("advisor_report", "j1.m0", 7,
                           {"job": "j1", "report": {"recommend": "grow", "curve": [[1, 100.5], [2, 190]],
                                                    "nested": {"ok": True, "none": None}}}),
    "job_complete": sign("job_complete", "j1.m0", 8,
                         {"job": "j1", "status": "succeeded", "steps": 1000, "samples": 64000,
                          "message": ""}),
    # job_saved (protocol.md): kind park|snapshot, step and bytes in [0, 2^53],
    # write_s in [0, 86400]; the snapshot seed sits on the upper bounds.
    "job_saved": sign("job_saved", "j1.m0", 9,
                      {"job": "j1", "runtime_id": "j1.i2", "kind": "park", "step": 1200,
                       "bytes": 84213760, "write_s": 0.75}),
    "job_saved_snapshot": sign("job_saved", "j1.m1", 10,
                               {"job": "j1", "runtime_id": "j1.i2", "kind": "snapshot",
                                "step": 2**53, "bytes": 2**53, "write_s": 86400}),
    "allocation_plan": sign("allocation_plan", "allocator", 17,
                            {"plan": 3, "decided_at": 1700000000.125, "policy": "milp", "reason": "submit",
                             "assignments": [{"node": "n1", "job": "j1"}, {"node": "n2", "job": None}],
                             "sizes": [{"job": "j1", "nodes": 1}],
                             "launches": [{"job": "j1", "runtime_id": "j1.i1", "bootstrap_node": "n1"}]}),
    "allocator_status": sign("allocator_status", "allocator", 18,
                             {"status": {"jobs": [{"job": "j1", "phase": "running"}], "now": 1700000000.5}}),
    "replay_guard": b"malle-replay-guard v1\nwatermark_us 1700000000000000\nsenders 2\n"
                    b"agent-n1 5 1700000000250000\nallocator 17 1700000001000000\n",
}

# The test vector of protocol.md ("Wire format"): secret = 32 x "k". If this
# implementation drifts from the documented MAC scheme, the seeds would all be
# refused at the MAC check and the fuzzer would never reach the parser.
DOC_VECTOR = (b'{"v":1,"type":"node_leave","sender":"agent-1","seq":5,"ts":1700000000.25,'
              b'"body":{"node":"n1","reason":"drained"}} '
              b'b5774f2e395e0784713908153886c2061051b7e531f9419d5faa496fd1ae9100')


def check_doc_vector():
    data, mac = DOC_VECTOR.rsplit(b" ", 1)
    ours = hmac.new(b"k" * 32, CONTEXT + data, hashlib.sha256).hexdigest().encode()
    if ours != mac:
        sys.exit("make_corpus.py: the MAC of protocol.md's test vector does not match")


if __name__ == "__main__":
    check_doc_vector()
    out = sys.argv[1] if len(sys.argv) > 1 else "corpus/control_message"
    os.makedirs(out, exist_ok=True)
    for name, data in MESSAGES.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
