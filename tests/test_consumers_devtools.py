"""Launch flows bind in Chrome DevTools (its trace engine, run in node) and by Perfetto's JSON rules.

DevTools binds a flow event to the slice with the same ts, pid, tid *and* category;
Perfetto's JSON importer keys a v1 flow on (id, category, name) and binds ``s`` to the slice
open on its thread, ``f`` with ``bp: "e"`` to the enclosing slice.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from cltrace.cli.demo import run_demo
from node_consumers import run_node

DEVTOOLS_FLOWS = """
import fs from 'node:fs';
import {analyzeEvents} from '@paulirish/trace_engine/analyze-trace.mjs';
const events = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const {parsedTrace} = await analyzeEvents(events);
const flows = parsedTrace.data.Flows.flows.map(
  flow => flow.map(e => ({ph: e.ph, cat: e.cat, pid: e.pid, tid: e.tid, span: e.args?.span ?? null})));
console.log(JSON.stringify(flows));
"""


@pytest.fixture(scope="module")
def demo_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("demo")
    return run_demo(out_dir=str(out), steps=6, formats=("json",)).paths[0]


def launch_pairs(events: list[dict[str, Any]]) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
    """Span id -> (host slice, device slice) of every launch (kernel/transfer) that reached a device."""
    slices: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and e["cat"] not in ("region", "step", "compile"):
            slices.setdefault(e["args"]["span"], []).append(e)
    return {sid: (xs[0], xs[1]) for sid, xs in slices.items() if len(xs) == 2}


def test_every_launch_flow_binds_in_devtools(demo_json: str) -> None:
    with open(demo_json) as fh:
        events = json.load(fh)
    pairs = launch_pairs(events)
    assert len(pairs) > 50
    flows = run_node(DEVTOOLS_FLOWS, demo_json)
    assert len(flows) == len(pairs), f"DevTools bound {len(flows)} of {len(pairs)} launch flows"
    for flow in flows:
        assert [e["ph"] for e in flow] == ["X", "X"]
        host, device = pairs[flow[0]["span"]]
        assert flow[1]["span"] == flow[0]["span"]
        assert (flow[0]["pid"], flow[0]["tid"]) == (host["pid"], host["tid"])
        assert (flow[1]["pid"], flow[1]["tid"]) == (device["pid"], device["tid"])


def test_every_launch_flow_binds_by_perfettos_json_rules(demo_json: str) -> None:
    with open(demo_json) as fh:
        events = json.load(fh)
    pairs = launch_pairs(events)
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f"}
    assert set(starts) == set(ends) == set(pairs)
    for sid, (host, device) in pairs.items():
        s, f = starts[sid], ends[sid]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"])  # one v1 flow key
        assert (s["pid"], s["tid"]) == (host["pid"], host["tid"])
        assert float(host["ts"]) <= float(s["ts"]) <= float(host["ts"]) + float(host["dur"])
        assert f.get("bp") == "e" and (f["pid"], f["tid"], f["ts"]) == (device["pid"], device["tid"], device["ts"])
