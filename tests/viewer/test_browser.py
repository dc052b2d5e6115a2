"""The viewer in a real browser: Debian's Chromium, headless, driven over the DevTools protocol, against the real
``agentrl view`` command serving run directories written by the real writers. Assertions are on the rendered DOM,
the page's JS errors and CSP reports, and screenshots."""

import asyncio
import io
import json
import urllib.request
from pathlib import Path

from agentrl.controller.runlog import TRAJECTORIES, TrajectoryLog
from agentrl.trajectory import Trajectory
from agentrl.testing.browser import Chromium, needs_chromium
from agentrl.viewer.tokens import find_tokenizer

pytestmark = needs_chromium()

SECRET = "TOP-SECRET-9c2a"
PAYLOADS = [
    "<script>window.__pwned = 'script'</script>",
    '<img src=x onerror="window.__pwned = \'img\'">',
    '"><svg onload="window.__pwned = \'svg\'"></svg>',
    "<iframe srcdoc=\"<script>parent.__pwned='iframe'</script>\"></iframe>",
    "javascript:window.__pwned='href'",
]
HOSTILE = " ".join(PAYLOADS)
# Resolves once a fresh image request from the page has failed: image loads asked for before it have had their turn.
SETTLE = ("new Promise(r => { const i = new Image(); i.onload = i.onerror = () => requestAnimationFrame(() => r(true));"
          " i.src = '/__settle?' + Math.random(); })")


async def _console_says(page, text: str, timeout_s: float = 30) -> None:
    """Waits until the page has logged a console message containing ``text``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not any(text in e.get("text", "") for e in page.console):
        assert loop.time() < deadline, f"no console message with {text!r} after {timeout_s} s"
        await asyncio.sleep(0.02)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def assert_not_blank(png: bytes, min_colours: int = 12) -> None:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) >= min_colours, "screenshot is (nearly) one colour"
    top = max(c for c, _ in colours)
    assert top < 0.97 * img.width * img.height, "screenshot is blank"


async def no_script_errors(page: Chromium) -> None:
    assert page.exceptions == []
    bad = [e for e in page.console if e.get("level") in ("error", "warning") and "favicon" not in e.get("text", "")]
    assert bad == [], bad


def test_list_curves_trajectory_hover_and_diff(run_dir, view, tmp_path):
    srv = view(run_dir)
    assert srv.url.startswith("http://127.0.0.1:")  # loopback unless --host says otherwise
    rows = get_json(srv.url + "api/list?limit=500")["rows"]
    recorded = next(r for r in rows if r["env"] == "agentrl/ToolUse-v0" and r["turns"] and r["turns"] >= 2)
    group = get_json(srv.url + f"api/group?row={recorded['row']}")["rows"]
    v = get_json(srv.url + f"api/trajectory?row={recorded['row']}")
    assert v["tokens"]["tlp"] is not None, "the fixture records every trajectory"

    async def go():
        async with Chromium(width=1400, height=1000) as page:
            await page.navigate(srv.url)
            await page.wait_for("document.body.dataset.listReady")
            assert await page.evaluate("document.querySelectorAll('#list tbody tr').length") == 24
            assert "24 trajectories" in await page.evaluate("document.getElementById('run-info').textContent")
            charts = await page.evaluate("[...document.querySelectorAll('.chart')].map(c => c.dataset.metric)")
            assert {"reward", "train/loss", "train/staleness/mean"} <= set(charts)
            assert await page.evaluate("document.querySelector('.chart[data-metric=reward] path.series').getAttribute('d').length") > 5
            assert await page.evaluate("document.getElementById('problems').hidden")
            assert_not_blank(await page.screenshot(tmp_path / "list.png"))

            # Filter by env through the form, as a user does.
            await page.evaluate("""(() => { const f = document.getElementById('filters');
                f.env.value = 'agentrl/FrozenLake-v0'; f.requestSubmit(); })()""")
            await page.wait_for("location.hash.includes('env=') && document.querySelectorAll('#list tbody tr').length === 12")
            envs = await page.evaluate("[...document.querySelectorAll('#list tbody tr td:nth-child(3)')].map(t => t.textContent)")
            assert set(envs) == {"agentrl/FrozenLake-v0"}

            # One trajectory: every token a span, coloured by mask and version, turns and tool calls as blocks.
            await page.evaluate(f"location.hash = '#/t/{recorded['row']}'")
            await page.wait_for(f"document.body.dataset.trajReady === '{recorded['row']}'")
            await page.wait_for(f"document.body.dataset.trajComplete === '{recorded['row']}'")
            n = v["tokens"]["n"]
            assert await page.evaluate("document.querySelectorAll('#chat span.t').length") == n
            text = await page.evaluate("[...document.querySelectorAll('#chat span.t')].map(s => s.textContent).join('')")
            assert text == "".join(v["tokens"]["text"])
            gen = sum(v["tokens"]["mask"])
            assert await page.evaluate("document.querySelectorAll('#chat span.t.v0').length") == gen
            assert await page.evaluate("document.querySelectorAll('#chat span.t.m0').length") == n - gen
            assert await page.evaluate("document.querySelectorAll('.block.kind-assistant').length") == recorded["turns"]
            assert await page.evaluate("document.querySelectorAll('.block.kind-tool').length") >= 1
            chips = await page.evaluate("[...document.querySelectorAll('.chip.toolcall')].map(c => c.textContent)")
            assert chips and all(c.startswith("tool call: ") for c in chips)
            rewards = await page.evaluate("[...document.querySelectorAll('.chip.reward')].map(c => c.textContent)")
            assert len(rewards) == recorded["turns"]
            assert await page.evaluate("document.querySelectorAll('#chat span.t.tc').length") > 0

            # Hover a generated token: id, behaviour and trainer log-probs, their difference, version.
            i = v["tokens"]["mask"].index(1)
            await page.evaluate(f"""(() => {{ const s = [...document.querySelectorAll('#chat span.t')][{i}];
                const r = s.getBoundingClientRect();
                s.dispatchEvent(new MouseEvent('mouseover', {{bubbles: true, clientX: r.left + 1, clientY: r.top + 1}})); }})()""")
            tip = await page.evaluate("document.getElementById('tip').hidden ? '' : document.getElementById('tip').textContent")
            assert f"token {i}  id {v['tokens']['ids'][i]}" in tip
            assert "policy version 0" in tip and "behaviour log-prob" in tip and "trainer log-prob" in tip
            expected = v["tokens"]["tlp"][i] - v["tokens"]["lp"][i]
            assert f"difference trainer − behaviour {expected:.4f}" in tip
            assert_not_blank(await page.screenshot(tmp_path / "trajectory.png"))

            # Colour by the trainer/behaviour difference.
            await page.evaluate("""(() => { const s = document.getElementById('color-mode'); s.value = 'delta';
                s.dispatchEvent(new Event('change')); })()""")
            await page.wait_for("document.body.dataset.modeReady === 'delta'")
            assert await page.evaluate("document.querySelectorAll('#chat span.t[class*=\" d\"]').length") == gen

            # Diff with another member of the group.
            other = next(r for r in group if r["row"] != recorded["row"])
            await page.evaluate(f"""(() => {{ const s = document.getElementById('diff-with'); s.value = '{other['row']}';
                s.dispatchEvent(new Event('change')); }})()""")
            await page.wait_for(f"document.body.dataset.diffReady === '{recorded['row']},{other['row']}'")
            cols = await page.evaluate("[...document.querySelectorAll('#chat .col')].map(c => c.querySelectorAll('span.t').length)")
            assert cols == [n, other["tokens"]]
            heads = await page.evaluate("[...document.querySelectorAll('.col-head')].map(h => h.textContent)")
            assert recorded["id"] in heads[0] and other["id"] in heads[1]
            await no_script_errors(page)
            # Everything the page loaded came from the viewer itself.
            assert page.requests and all(u.startswith(srv.url) or u == "about:blank" for u in page.requests), \
                page.requests

    asyncio.run(go())


def hostile_run(root: Path, run_dir: Path) -> Path:
    """A run directory whose every string field carries HTML/JS payloads (tokens included)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(find_tokenizer(run_dir)))
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    prompt = enc(f"<|im_start|>system\n{HOSTILE}<|im_end|>\n<|im_start|>user\n{HOSTILE}<|im_end|>\n<|im_start|>assistant\n")
    answer = f"{HOSTILE}<tool_call>{{\"name\": \"{PAYLOADS[1]}\", \"arguments\": {{}}}}</tool_call>"
    gen = enc(answer + "<|im_end|>")
    env = enc(f"\n<|im_start|>user\n<tool_response>\n{HOSTILE}\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    ids = prompt + gen + env + gen
    mask = [0] * len(prompt) + [1] * len(gen) + [0] * len(env) + [1] * len(gen)
    t = Trajectory(
        id=f"x{PAYLOADS[2]}", group_id=PAYLOADS[1], env_id=PAYLOADS[0], task={"q": HOSTILE}, token_ids=ids, loss_mask=mask,
        logprobs=[-0.25 * m for m in mask], versions=[0 if m else -1 for m in mask], prompt_len=len(prompt),
        messages=[{"role": "system", "content": HOSTILE}, {"role": "user", "content": HOSTILE},
                  {"role": "assistant", "content": answer}, {"role": "tool", "name": PAYLOADS[3], "content": HOSTILE},
                  {"role": "assistant", "content": answer}],
        rewards=[0.0, 1.0], reward=1.0, termination="error", error=HOSTILE, num_turns=2,
        info={"path": "../../../../etc/passwd", "html": HOSTILE})
    t.validate()
    root.mkdir()
    log = TrajectoryLog(root).open(0)
    log.write_trajectories(1, [t, Trajectory(id="plain", group_id=PAYLOADS[1], env_id=PAYLOADS[0])])
    log.write_logprobs(1, [{"trajectory_id": t.id, "version": 0, "logprobs": [-0.5] * (len(ids) - 1)}])
    log.close()
    (root / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 1.0, PAYLOADS[1]: 2.0}) + "\n")
    (root.parent / "secret.txt").write_text(SECRET)
    return root


def test_hostile_text_and_paths_do_not_get_through(run_dir, view, tmp_path):
    root = hostile_run(tmp_path / "run", run_dir)
    srv = view(root, "--tokenizer", str(find_tokenizer(run_dir)))

    async def go():
        async with Chromium() as page:
            await page.navigate(srv.url)
            await page.wait_for("document.body.dataset.listReady")
            await page.evaluate(f"""(() => {{ const s = document.getElementById('metric-add');
                s.value = {json.dumps(PAYLOADS[1])}; s.dispatchEvent(new Event('change')); }})()""")
            await page.wait_for(f"!!document.querySelector('.chart[data-metric=\"' + CSS.escape({json.dumps(PAYLOADS[1])}) + '\"]')")
            cells = await page.evaluate("[...document.querySelectorAll('#list tbody td')].map(t => t.textContent)")
            assert PAYLOADS[0] in cells and f"x{PAYLOADS[2]}" in cells  # shown as text
            await page.evaluate("location.hash = '#/t/0'")
            await page.wait_for("document.body.dataset.trajComplete === '0'")
            chat = await page.evaluate("document.getElementById('chat').textContent")
            assert chat.count(PAYLOADS[0]) >= 4 and PAYLOADS[1] in chat
            await page.evaluate("document.querySelectorAll('#traj-head details').forEach(d => d.open = true)")
            head = await page.evaluate("document.getElementById('traj-head').textContent")
            assert PAYLOADS[0] in head and "../../../../etc/passwd" in head
            await page.evaluate(SETTLE)  # an injected image's error handler would have run by now
            assert await page.evaluate("window.__pwned === undefined")
            # Nothing from the data became an element: one script (app.js), no img/svg-with-handlers/iframes.
            assert await page.evaluate("document.scripts.length") == 1
            assert await page.evaluate("document.querySelectorAll('img, iframe, #chat svg, #list svg, [onerror], [onload]').length") == 0
            # Defence in depth: even markup injected on purpose cannot run inline code under the page's CSP.
            await page.evaluate("""document.body.insertAdjacentHTML('beforeend',
                '<img src=/nope onerror="window.__csp = 1"><script>window.__csp = 2</script>')""")
            await _console_says(page, "Content Security Policy")  # the handler was refused, not late
            assert await page.evaluate("window.__csp === undefined")
            assert page.exceptions == []
            # Traversal through the address bar, plain and percent-encoded.
            for target in ("static/..%2f..%2fsecret.txt", "static/%2e%2e%2f%2e%2e%2fsecret.txt", "../secret.txt",
                           "%2e%2e/secret.txt", "api/trajectory?row=..%2f..%2fsecret.txt"):
                await page.navigate(srv.url + target)
                body = await page.evaluate("document.documentElement.textContent")
                assert SECRET not in body, target

    asyncio.run(go())


def test_malformed_lines_are_reported_in_the_page(run_copy, view, tmp_path):
    f = run_copy / TRAJECTORIES
    lines = f.read_text().splitlines(keepends=True)
    f.write_text(lines[0] + "{oops\n" + "".join(lines[1:3]) + "42\n" + "".join(lines[3:]) + lines[0][:50])
    with open(run_copy / "metrics.jsonl", "a") as m:
        m.write("not json at all\n")
    srv = view(run_copy)

    async def go():
        async with Chromium() as page:
            await page.navigate(srv.url)
            await page.wait_for("document.body.dataset.listReady")
            assert not await page.evaluate("document.getElementById('problems').hidden")
            text = await page.evaluate("document.getElementById('problems').textContent")
            assert "trajectories.jsonl: 2 malformed lines skipped (lines 2, 5)" in text
            assert "line 2: not JSON" in text and "line 5: not a JSON object" in text
            assert "the last line is incomplete" in text
            assert "metrics.jsonl: 1 malformed line skipped (line 3)" in text
            assert await page.evaluate("document.querySelectorAll('#list tbody tr').length") == 24
            assert_not_blank(await page.screenshot(tmp_path / "problems.png"))
            await no_script_errors(page)

    asyncio.run(go())
