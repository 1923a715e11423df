"""A cltrace run in speedscope, read by speedscope's own importer (its release bundle, run in node).

speedscope names a Chrome JSON frame by its name plus the JSON of its ``args`` (cltrace's span
ids and stamps), so the .json gives one frame per slice and its left-heavy view groups nothing;
the ``.speedscope.json`` format gives one frame per name, so repeated work adds up.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from cltrace.cli.demo import run_demo
from cltrace.export.formats import format_for
from cltrace.export.speedscope import SpeedscopeSink
from cltrace.read import load
from node_consumers import run_node

# The importer is not exported by the package: the release bundle is run without its UI, in a
# context with the few browser globals it touches at load, and its importProfileGroupFromText
# is handed out instead of the app being rendered.
SPEEDSCOPE = r"""
import fs from 'node:fs';
import vm from 'node:vm';
import {createRequire} from 'node:module';
const require = createRequire(import.meta.url);
const dir = require.resolve('speedscope/package.json').replace(/package\.json$/, 'dist/release/');
let src = fs.readFileSync(dir + fs.readdirSync(dir).find(f => /^speedscope-.*\.js$/.test(f)), 'utf8');
const importer = src.match(/async function (\w+)\(t,e\)\{return\(await \w+\)\.importProfileGroupFromText\(t,e\)\}/)[1];
src = src.slice(0, src.indexOf('console.log(`speedscope v')) + `globalThis.__import=${importer};})();`;
const noop = () => {};
const el = () => new Proxy(function() {}, {get: (t, k) => k === Symbol.toPrimitive ? () => '' : el(), apply: () => el()});
const ctx = {console, setTimeout, clearTimeout, queueMicrotask, URL, TextDecoder, TextEncoder, atob, btoa,
  document: el(), navigator: {userAgent: 'node', platform: 'node'}, devicePixelRatio: 1,
  location: {href: 'http://localhost/', protocol: 'http:', hash: '', search: ''},
  localStorage: {getItem: () => null, setItem: noop}, addEventListener: noop, removeEventListener: noop,
  matchMedia: () => ({matches: false, addEventListener: noop, removeEventListener: noop, addListener: noop}),
  requestAnimationFrame: noop};
ctx.window = ctx.self = ctx;
vm.createContext(ctx);
vm.runInContext(src, ctx);
const path = process.argv[2];
const group = await ctx.__import(path.split('/').pop(), fs.readFileSync(path, 'utf8'));
if (!group) throw new Error('speedscope could not import ' + path);
const profiles = group.profiles.map(p => {
  const frames = new Set();
  p.forEachFrame(f => frames.add(f.key));
  const tree = [];
  const walk = (node, path) => {
    for (const child of node.children) {
      const here = [...path, child.frame.name];
      tree.push({path: here, weight: child.getTotalWeight()});
      if (here.length < 4) walk(child, here);
    }
  };
  walk(p.getGroupedCalltreeRoot(), []);
  return {name: p.getName(), frames: frames.size, weight: p.getTotalWeight(), tree};
});
console.log(JSON.stringify(profiles));
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    out = tmp_path_factory.mktemp("ss")
    ss = str(out / "demo.speedscope.json")
    res = run_demo(out_dir=str(out), steps=8, formats=("json",), extra_sinks=(SpeedscopeSink(ss),))
    return res.paths[0], ss


def test_the_format_is_told_by_its_suffix() -> None:
    assert format_for("run.speedscope.json") == "speedscope"
    assert format_for("run.json") == "json"


def test_speedscope_groups_repeated_work(run: tuple[str, str]) -> None:
    chrome_json, ss = run
    spans, _ = load(chrome_json)
    host_names = {s.name for s in spans}
    steps = [s for s in spans if s.cat == "step"]
    assert len(steps) == 6  # 8 steps in two cycles of one warm-up (not written) and 3 active steps

    as_chrome = run_node(SPEEDSCOPE, chrome_json)
    main_chrome = next(p for p in as_chrome if "MainThread" in p["name"])
    assert main_chrome["frames"] >= len(steps) * 4  # the problem: a frame per slice

    profiles = {p["name"]: p for p in run_node(SPEEDSCOPE, ss)}
    main = profiles["MainThread"]
    assert main["frames"] <= len(host_names)  # a frame per name
    tree = {tuple(n["path"]): n["weight"] for n in main["tree"]}
    assert tree[("step",)] == sum(s.host_end - s.host_begin for s in steps)  # ns, "step 1", "step 2"... in one node
    assert {p[1] for p in tree if p[0] == "step" and len(p) == 2} >= {"forward", "backward", "optimizer"}

    (queue,) = [p for name, p in profiles.items() if name.startswith("OpenCL: ")]
    qtree = {tuple(n["path"]): n["weight"] for n in queue["tree"]}
    gemm_device = sum(s.dev_end - s.dev_start for s in spans if s.name == "gemm" and s.dev_start is not None)
    under_step = sum(w for p, w in qtree.items() if p[-1] == "gemm" and p[0] == "step" and len(p) == 3)
    assert gemm_device > 0 and under_step == gemm_device  # device time, grouped by region path


def test_overlapping_spans_go_to_a_further_profile(tmp_path: Any) -> None:
    from cltrace.record.recorder import Recorder
    from cltrace.timeline.spans import Span

    rec = Recorder()
    sink = SpeedscopeSink(tmp_path / "o.speedscope.json")
    sink.start(rec)
    t = rec.tracks.host_thread(1, "T")
    base = rec.start_ns
    sink.write([Span(1, 0, "a", "region", t, base + 0, base + 100), Span(2, 0, "b", "region", t, base + 50, base + 150),
                Span(3, 1, "c", "kernel", t, base + 10, base + 20)])
    sink.close({})
    doc = json.loads((tmp_path / "o.speedscope.json").read_text())
    assert [p["name"] for p in doc["profiles"]] == ["T", "T (2)"]
    profiles = {p["name"]: p["weight"] for p in run_node(SPEEDSCOPE, str(tmp_path / "o.speedscope.json"))}
    assert profiles == {"T": 100, "T (2)": 100}
