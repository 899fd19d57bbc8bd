"""The page's stylesheet, inlined so the report is one file that works opened from disk."""

CSS = """
:root { --fail: #b91c1c; --fail-bg: #fee2e2; --warn: #a16207; --warn-bg: #fef3c7; --pass: #15803d;
  --pass-bg: #dcfce7; --skip: #4b5563; --skip-bg: #e5e7eb; --line: #e5e7eb; --muted: #6b7280; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #111827;
  background: #f9fafb; }
main { max-width: 1240px; margin: 0 auto; padding: 0 20px 40px; }
header.verdict { display: flex; gap: 20px; align-items: center; padding: 18px 24px; border-bottom: 4px solid; }
header.fail { background: var(--fail-bg); border-color: var(--fail); }
header.warn { background: var(--warn-bg); border-color: var(--warn); }
header.pass { background: var(--pass-bg); border-color: var(--pass); }
.badge { font-size: 34px; font-weight: 800; letter-spacing: 2px; padding: 6px 18px; border-radius: 8px; color: #fff; }
header.fail .badge { background: var(--fail); } header.warn .badge { background: var(--warn); }
header.pass .badge { background: var(--pass); }
header h1 { margin: 0; font-size: 20px; } header p { margin: 2px 0; }
.counts { font-size: 16px; font-weight: 600; } .meta, .muted { color: var(--muted); font-size: 12px; }
h2 { margin: 28px 0 10px; font-size: 18px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { margin: 0 0 6px; font-size: 16px; } h4 { margin: 12px 0 4px; font-size: 13px; text-transform: uppercase;
  letter-spacing: .04em; color: #374151; }
table { border-collapse: collapse; width: 100%; background: #fff; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f4f6; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.kv th { width: 210px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
pre { background: #111827; color: #f9fafb; padding: 8px 10px; border-radius: 6px; overflow-x: auto;
  white-space: pre-wrap; word-break: break-all; margin: 4px 0; }
pre.message { background: #fff7ed; color: #7c2d12; border: 1px solid #fed7aa; }
.pill { display: inline-block; font-size: 11px; font-weight: 700; padding: 1px 7px; border-radius: 9px;
  letter-spacing: .03em; vertical-align: middle; }
.failed .pill, .pill.failed, .pill.regressed, .pill.unstable { background: var(--fail-bg); color: var(--fail); }
.pill.warning, .pill.inconclusive, .pill.incomparable { background: var(--warn-bg); color: var(--warn); }
.pill.passed, .pill.pass, .pill.improved { background: var(--pass-bg); color: var(--pass); }
.pill.skipped { background: var(--skip-bg); color: var(--skip); }
article.item { background: #fff; border: 1px solid var(--line); border-left: 5px solid var(--skip);
  border-radius: 6px; padding: 12px 16px; margin: 14px 0; }
article.failed { border-left-color: var(--fail); } article.warning { border-left-color: var(--warn); }
article.passed { border-left-color: var(--pass); }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
@media (max-width: 900px) { .cols { grid-template-columns: 1fr; } }
svg.plot { width: 100%; height: auto; max-height: 300px; background: #fff; }
.note { color: var(--muted); font-style: italic; }
td.detail { min-width: 200px; } .scroll { overflow-x: auto; }
td.bad { color: var(--fail); font-weight: 600; }
a { color: #1d4ed8; text-decoration: none; } a:hover { text-decoration: underline; }
details summary { cursor: pointer; color: #374151; }
"""
