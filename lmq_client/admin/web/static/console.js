// lmq console: the little the pages need beyond htmx. Loaded as a file (the Content-Security-
// Policy allows no inline script); everything it reads comes from data-* attributes.
(function () {
  "use strict";

  // Destructive actions ask first: <form data-confirm="Delete topic T?">.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);

  // The live tail keeps the newest messages only.
  document.addEventListener("htmx:sseMessage", function () {
    var list = document.getElementById("tail-messages");
    if (!list) { return; }
    var keep = parseInt(list.getAttribute("data-keep") || "500", 10);
    while (list.children.length > keep) { list.removeChild(list.lastElementChild); }
    var count = document.getElementById("tail-count");
    if (count) { count.textContent = String(parseInt(count.textContent || "0", 10) + 1); }
  });

  // Charts: <div class="charts" data-series="URL" data-refresh="ms">, drawn with uPlot.
  var CHARTS = [
    ["Depth", [["depth", "depth"], ["in_flight", "in flight"], ["deferred", "deferred"]]],
    ["Rates (msgs/s)", [["publish_rate", "published"], ["delivery_rate", "delivered"]]],
    ["Requeues and timeouts (msgs/s)", [["requeue_rate", "requeued"], ["timeout_rate", "timed out"]]],
    ["E2E latency, highest percentile (ms)", [["e2e_ms", "e2e"]]]
  ];
  var COLOURS = ["#2457c5", "#d9822b", "#1f7a3d", "#b3261e"];

  function drawCharts(box, data) {
    box.innerHTML = "";
    CHARTS.forEach(function (spec) {
      var holder = document.createElement("div");
      holder.className = "chart";
      var title = document.createElement("h3");
      title.textContent = spec[0];
      holder.appendChild(title);
      box.appendChild(holder);
      var chartWidth = Math.max(240, holder.clientWidth - 8);
      var series = [{}];
      var columnsData = [data.t];
      spec[1].forEach(function (entry, i) {
        series.push({ label: entry[1], stroke: COLOURS[i], width: 1.5 });
        columnsData.push(data[entry[0]]);
      });
      new uPlot({ width: chartWidth, height: 160, series: series, legend: { live: false } },
                columnsData, holder);
    });
  }

  function loadCharts(box) {
    fetch(box.getAttribute("data-series"), { credentials: "same-origin" })
      .then(function (response) { return response.json(); })
      .then(function (data) { drawCharts(box, data); box.setAttribute("data-drawn", String(data.t.length)); })
      .catch(function () { box.textContent = "charts unavailable"; });
  }

  function startCharts() {
    var boxes = document.querySelectorAll("[data-series]");
    boxes.forEach(function (box) {
      loadCharts(box);
      var every = parseInt(box.getAttribute("data-refresh") || "0", 10);
      if (every > 0) { setInterval(function () { loadCharts(box); }, every); }
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", startCharts);
  } else {
    startCharts();
  }
})();
