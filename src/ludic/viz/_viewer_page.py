"""The viewer page shell and its stylesheet (string constants; the script is in `_viewer_js`).

Self-contained on purpose: system fonts only, no external URL, so the file opens offline.
"""

PAGE_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="ludic viewer">
<title>__TITLE__</title>
<style>__CSS__</style>
</head>
<body>
<header id="topbar"></header>
<div id="layout">
  <aside id="sidebar">
    <div id="filters"></div>
    <ol id="episode-list"></ol>
  </aside>
  <main id="detail"></main>
</div>
<script type="application/json" id="ludic-data">__DATA__</script>
<script>__JS__</script>
</body>
</html>
"""

CSS = r"""
:root {
  --bg: #f5f6f8; --panel: #ffffff; --line: #e4e7ec; --line2: #d0d5dd; --text: #1d2433;
  --muted: #667085; --faint: #98a2b3; --accent: #4f46e5; --accent-bg: #eef0ff;
  --good: #15803d; --good-bg: #dcfce7; --bad: #b42318; --bad-bg: #fee4e2;
  --warn: #b54708; --warn-bg: #fef0c7; --info: #175cd3; --info-bg: #e0ecff;
  --violet: #6941c6; --violet-bg: #f1ebff;
  --sans: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", "DejaVu Sans", sans-serif;
  --mono: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", monospace;
}
* { box-sizing: border-box; }
html, body { margin: 0; height: 100%; }
body { font: 14px/1.45 var(--sans); color: var(--text); background: var(--bg); display: flex; flex-direction: column; }
button { font: inherit; cursor: pointer; }
code, .mono { font-family: var(--mono); font-size: 12.5px; }

#topbar { display: flex; align-items: center; gap: 18px; padding: 10px 20px; background: #101828; color: #f2f4f7; flex: none; }
#topbar .brand { font-weight: 700; font-size: 16px; letter-spacing: .2px; white-space: nowrap; }
#topbar .brand span { color: #a5b4fc; }
#topbar .source { color: #98a2b3; font: 12px var(--mono); overflow: hidden; text-overflow: ellipsis; white-space: nowrap; min-width: 0; flex: 1 1 auto; }
#topbar .stat { display: flex; flex-direction: column; align-items: flex-end; flex: none; }
#topbar .stat b { font-size: 16px; font-variant-numeric: tabular-nums; }
#topbar .stat.minor b { font: 500 12.5px var(--mono); color: #d0d5dd; padding-bottom: 3px; }
#topbar .stat small { color: #98a2b3; font-size: 11px; text-transform: uppercase; letter-spacing: .6px; }
.dist { display: flex; width: 220px; height: 10px; border-radius: 6px; overflow: hidden; background: #344054; flex: none; }
.dist i { display: block; height: 100%; }

#layout { display: grid; grid-template-columns: 340px 1fr; flex: 1; min-height: 0; }
#sidebar { border-right: 1px solid var(--line); background: var(--panel); display: flex; flex-direction: column; min-height: 0; }
#filters { padding: 14px 16px 10px; border-bottom: 1px solid var(--line); display: flex; flex-direction: column; gap: 10px; }
#filters label.title { font-size: 11px; font-weight: 600; text-transform: uppercase; letter-spacing: .6px; color: var(--muted); }
#filters input[type=search], #filters input[type=number], #filters select {
  font: inherit; font-size: 13px; border: 1px solid var(--line2); border-radius: 8px; padding: 6px 9px; background: #fff; color: var(--text); width: 100%; }
#filters input:focus, #filters select:focus { outline: 2px solid var(--accent-bg); border-color: var(--accent); }
.range-row { display: grid; grid-template-columns: 1fr auto 1fr; align-items: center; gap: 6px; }
.range-row span { color: var(--faint); }
.hist { display: flex; align-items: flex-end; gap: 2px; height: 34px; }
.hist div { flex: 1; background: var(--line2); border-radius: 2px 2px 0 0; min-height: 2px; cursor: pointer; }
.hist div.on { background: var(--accent); }
.hist-axis { display: flex; justify-content: space-between; font: 11px var(--mono); color: var(--faint); margin-top: 2px; }
.chips { display: flex; flex-wrap: wrap; gap: 6px; }
.chip-toggle { border: 1px solid var(--line2); background: #fff; border-radius: 999px; padding: 2px 10px 2px 8px; font-size: 12.5px; display: inline-flex; align-items: center; gap: 6px; color: var(--text); }
.chip-toggle .dot { width: 8px; height: 8px; border-radius: 50%; }
.chip-toggle.on { background: var(--accent-bg); border-color: var(--accent); }
.chip-toggle small { color: var(--muted); font-variant-numeric: tabular-nums; }
.filter-foot { display: flex; justify-content: space-between; align-items: center; font-size: 12.5px; color: var(--muted); }
.linkish { background: none; border: 0; color: var(--accent); padding: 0; font-size: 12.5px; }

#episode-list { list-style: none; margin: 0; padding: 6px 8px 16px; overflow-y: auto; flex: 1; }
.ep-item { display: grid; grid-template-columns: 38px 1fr auto; gap: 2px 10px; align-items: center; padding: 8px 10px; border-radius: 10px; cursor: pointer; border: 1px solid transparent; }
.ep-item:hover { background: #f9fafb; border-color: var(--line); }
.ep-item.selected { background: var(--accent-bg); border-color: #c7ccff; }
.ep-item .num { grid-row: span 2; font: 12px var(--mono); color: var(--faint); }
.ep-item .main { display: flex; align-items: center; gap: 6px; min-width: 0; }
.ep-item .sub { font-size: 11.5px; color: var(--muted); white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.ep-item .reward { grid-row: span 2; font: 600 14px var(--mono); font-variant-numeric: tabular-nums; text-align: right; }
.flag { font-size: 11px; color: var(--muted); }
.empty { color: var(--muted); padding: 24px; text-align: center; }

.badge { display: inline-flex; align-items: center; gap: 4px; border-radius: 999px; padding: 1px 8px; font-size: 11.5px; font-weight: 600; white-space: nowrap; background: #f2f4f7; color: #344054; }
.badge.good { background: var(--good-bg); color: var(--good); }
.badge.bad { background: var(--bad-bg); color: var(--bad); }
.badge.warn { background: var(--warn-bg); color: var(--warn); }
.badge.info { background: var(--info-bg); color: var(--info); }
.badge.violet { background: var(--violet-bg); color: var(--violet); }
.badge.ghost { background: transparent; border: 1px solid var(--line2); color: var(--muted); font-weight: 500; }
.pos { color: var(--good); } .neg { color: var(--bad); } .zero { color: var(--muted); }

#detail { overflow-y: auto; padding: 22px 28px 60px; min-width: 0; }
.ep-head { background: var(--panel); border: 1px solid var(--line); border-radius: 14px; padding: 16px 20px; display: grid; grid-template-columns: 1fr auto; gap: 10px 20px; }
.ep-head h1 { margin: 0; font-size: 18px; display: flex; align-items: center; gap: 10px; flex-wrap: wrap; }
.ep-head h1 code { font-size: 13px; color: var(--muted); font-weight: 400; }
.ep-head .big { font: 700 30px var(--mono); text-align: right; line-height: 1; font-variant-numeric: tabular-nums; }
.ep-head .big small { display: block; font: 11px var(--sans); color: var(--muted); text-transform: uppercase; letter-spacing: .6px; margin-top: 4px; }
.facts { display: flex; flex-wrap: wrap; gap: 6px 18px; font-size: 12.5px; color: var(--muted); grid-column: 1 / -1; }
.facts b { color: var(--text); font-weight: 600; font-family: var(--mono); font-size: 12px; }
.alert { grid-column: 1 / -1; border-radius: 10px; padding: 9px 12px; font-size: 13px; }
.alert.bad { background: var(--bad-bg); color: var(--bad); }
.alert.warn { background: var(--warn-bg); color: var(--warn); }
details.meta { grid-column: 1 / -1; font-size: 12.5px; }
details.meta summary { color: var(--muted); cursor: pointer; }
details.meta pre { background: #f9fafb; border: 1px solid var(--line); border-radius: 8px; padding: 8px 10px; overflow-x: auto; margin: 6px 0 0; }

.legend { display: flex; gap: 14px; align-items: center; font-size: 12px; color: var(--muted); margin: 16px 2px 8px; flex-wrap: wrap; }
.turn { background: var(--panel); border: 1px solid var(--line); border-radius: 14px; margin-top: 14px; overflow: hidden; }
.turn > header { display: flex; align-items: center; gap: 8px; padding: 10px 16px; border-bottom: 1px solid var(--line); background: #fcfcfd; flex-wrap: wrap; }
.turn > header h2 { margin: 0; font-size: 14px; }
.turn > header .spacer { flex: 1; }
.turn > header .rw { font: 600 13px var(--mono); }
.turn .body { padding: 12px 16px 14px; display: flex; flex-direction: column; gap: 8px; }

.msg { border-radius: 12px; padding: 8px 12px 9px; max-width: 920px; border: 1px solid var(--line); }
.msg .role { font-size: 10.5px; font-weight: 700; text-transform: uppercase; letter-spacing: .7px; color: var(--muted); margin-bottom: 3px; display: flex; gap: 8px; align-items: center; flex-wrap: wrap; }
.msg .content { font-family: var(--mono); font-size: 12.5px; white-space: pre-wrap; word-break: break-word; }
.msg.user { background: #f8fafc; }
.msg.system { background: #fffbeb; border-color: #fde68a; }
.msg.tool { background: #f0f9ff; border-color: #bae6fd; }
.msg.tool.error { background: var(--bad-bg); border-color: #fecdca; }
.msg.assistant { background: #f5f3ff; border-color: #ddd6fe; margin-left: 28px; }
.msg.assistant .role { color: var(--violet); }
.msg .role .badge { text-transform: none; letter-spacing: 0; font-weight: 500; }
.toolcall { margin-top: 6px; font-family: var(--mono); font-size: 12px; background: #fff; border: 1px dashed #c4b5fd; border-radius: 8px; padding: 4px 8px; white-space: pre-wrap; word-break: break-word; }
.toolcall b { color: var(--violet); }
.note { font-size: 12.5px; border-radius: 8px; padding: 4px 10px; display: flex; width: fit-content; gap: 8px; align-items: baseline; flex-wrap: wrap; max-width: 920px; }
.note.rewrite { background: var(--violet-bg); color: var(--violet); border: 1px dashed #b692f6; }
.note.parse-bad { background: var(--bad-bg); color: var(--bad); margin-left: 28px; }
.note.parse-ok { background: var(--good-bg); color: var(--good); margin-left: 28px; }
.envstep { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; font-size: 12.5px; padding: 7px 10px; border-radius: 10px; background: #f9fafb; border: 1px solid var(--line); max-width: 920px; }
.envstep .arrow { color: var(--accent); font-weight: 700; }
.envstep details { flex-basis: 100%; }
.envstep details summary { color: var(--muted); cursor: pointer; }
.envstep pre { margin: 4px 0 0; font: 12px var(--mono); white-space: pre-wrap; }

.samples { margin-top: 4px; border-top: 1px dashed var(--line2); padding-top: 10px; }
.samples > summary { cursor: pointer; font-size: 12.5px; color: var(--muted); font-weight: 600; }
.sample { margin-top: 8px; }
.sample-head { display: flex; gap: 6px; align-items: center; flex-wrap: wrap; font-size: 12px; color: var(--muted); margin-bottom: 5px; }
.snapcut { display: flex; align-items: center; gap: 10px; color: var(--violet); font-size: 12px; font-weight: 600; margin: 10px 0 2px; }
.snapcut::before, .snapcut::after { content: ""; flex: 1; border-top: 2px dashed #b692f6; }
.tokens { font-family: var(--mono); font-size: 12px; line-height: 1.9; white-space: pre-wrap; word-break: break-all; background: #fcfcfd; border: 1px solid var(--line); border-radius: 10px; padding: 8px 10px; max-height: 420px; overflow-y: auto; }
.tok { border-radius: 2px; padding: 1px 0; }
.tok.prm { background: #f0f2f5; color: #667085; }
.tok.prm.o { background: #e2e6ec; }
.tok.act { background: #dbe4ff; color: #1d2b8f; box-shadow: inset 0 -2px 0 #748ffc; }
.tok.act.o { background: #c5d3ff; }
.tok.act.wpos { background: #d3f9d8; color: #0b5b23; box-shadow: inset 0 -2px 0 #40c057; }
.tok.act.wpos.o { background: #b2f2bb; }
.tok.act.wneg { background: #ffe3e3; color: #8a1c1c; box-shadow: inset 0 -2px 0 #fa5252; }
.tok.act.wneg.o { background: #ffc9c9; }
.legend .tok { padding: 1px 6px; }
.tok.special { font-weight: 700; font-size: 10.5px; }
.tok:hover { outline: 1px solid var(--accent); }
.collapsed { display: inline-block; border: 1px dashed var(--line2); background: #fff; color: var(--muted); border-radius: 6px; padding: 0 8px; margin: 0 3px; font: 11.5px var(--sans); }
.collapsed:hover { color: var(--accent); border-color: var(--accent); }
kbd { font: 11px var(--mono); border: 1px solid var(--line2); border-bottom-width: 2px; border-radius: 4px; padding: 0 4px; background: #fff; color: var(--muted); }
"""
