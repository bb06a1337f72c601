"""The page around the HTML report: styles, the plot bootstrap, and placeholders.

Placeholders are replaced with str.replace, never str.format (CSS and JS are
full of braces). @@TITLE@@ and @@BODY@@ get escaped HTML, @@DATA@@ the
script-safe JSON (reports.html.script_json), @@PLOTLYJS@@ plotly.js itself.
The bootstrap records errors and the number of plots drawn on window.__pslat
and in <body data-*>, so that a browser test can read them from the DOM.
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:">
<title>@@TITLE@@</title>
<script>
window.__pslat = {errors: [], plots: 0, expected: 0, ready: false};
window.addEventListener("error", function (e) { window.__pslat.errors.push(String(e.message || e)); });
</script>
<style>
body { font-family: "DejaVu Sans", system-ui, sans-serif; margin: 0; color: #1d1d1f; background: #fafafa; }
header { background: #24292f; color: #fff; padding: 14px 28px; }
header h1 { margin: 0; font-size: 20px; }
header p { margin: 4px 0 0; color: #c9d1d9; font-size: 13px; }
nav { padding: 8px 28px; background: #eaeef2; font-size: 13px; position: sticky; top: 0; z-index: 5; }
nav a { margin-right: 14px; color: #0b4f9c; text-decoration: none; }
main { padding: 8px 28px 40px; max-width: 1400px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; margin: 16px 0; padding: 4px 18px 14px; }
h2 { font-size: 17px; border-bottom: 1px solid #d0d7de; padding-bottom: 6px; }
h3 { font-size: 14px; margin: 14px 0 4px; }
p.help { color: #57606a; font-size: 13px; margin: 4px 0 8px; max-width: 980px; }
ul.findings li { margin: 6px 0; line-height: 1.4; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 10px; }
th, td { border-bottom: 1px solid #e1e4e8; padding: 3px 9px; text-align: right; white-space: nowrap; }
th { background: #f6f8fa; font-weight: 600; }
td.l, th.l { text-align: left; }
tr.sub td { color: #57606a; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 8px 18px; }
.plot { min-height: 340px; }
.muted { color: #57606a; }
.warn { color: #9a3412; }
code { font-size: 12px; }
</style>
</head>
<body data-plots="0" data-errors="0" data-ready="0">
<header><h1>pslat report</h1><p>@@SUBTITLE@@</p></header>
<nav>@@NAV@@</nav>
<main>
@@BODY@@
<p class="muted" id="pslat-status">plots: drawing</p>
</main>
<script>@@PLOTLYJS@@</script>
<script type="application/json" id="pslat-data">@@DATA@@</script>
<script>
(function () {
  var st = window.__pslat;
  st.t_plots_start_ms = performance.now();   // plotly.js parsed; the plots begin
  function done() {
    st.t_ready_ms = performance.now();
    st.ready = true;
    document.body.setAttribute("data-plots", String(st.plots));
    document.body.setAttribute("data-errors", String(st.errors.length));
    document.body.setAttribute("data-ready", "1");
    var el = document.getElementById("pslat-status");
    el.textContent = "plots: " + st.plots + " of " + st.expected + " drawn" +
      (st.errors.length ? "; errors: " + st.errors.join(" | ") : "");
  }
  try {
    var data = JSON.parse(document.getElementById("pslat-data").textContent);
    var figs = data.figures;
    st.expected = figs.length;
    var pending = [];
    figs.forEach(function (f) {
      var div = document.getElementById(f.div);
      if (!div) { st.errors.push("no element for plot " + f.div); return; }
      var p = Plotly.newPlot(div, f.data, f.layout, {displaylogo: false, responsive: true})
        .then(function () { st.plots += 1; }, function (e) { st.errors.push(String(e)); });
      pending.push(p);
    });
    Promise.all(pending).then(done, done);
  } catch (e) {
    st.errors.push(String(e));
    done();
  }
})();
</script>
</body>
</html>
"""
