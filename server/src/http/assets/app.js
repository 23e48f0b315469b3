// The web view's only script: follow a session's events and refresh what they change.
// (No inline scripts anywhere: the pages' Content-Security-Policy allows only these files.)
(function () {
  "use strict";
  var root = document.querySelector("[data-events]");
  if (!root) {
    return;
  }
  // Calls in progress: a pending row per call (`call_started`, `call_waiting`,
  // `call_decided`, `call_ended`), built with text only; the row goes when the call's own
  // row (its audit record: same time, tool and target) arrives with the next refresh.
  var pending = {};
  var finished = {};
  function pendingKey(d) {
    return d.time && d.target !== undefined ? d.time + "\u0000" + d.tool + "\u0000" + d.target : null;
  }
  function cell(className, text) {
    var span = document.createElement("span");
    span.className = className;
    span.textContent = text;
    return span;
  }
  function stateOf(name, d) {
    if (name === "call_waiting") {
      var device = d.uri ? d.uri.split(":")[0] : d.workspace;
      return { text: "waiting for approval on " + device, css: "waiting" };
    }
    if (name === "call_decided" && d.allowed === false) {
      return { text: "denied by " + d.decidedBy, css: "denied" };
    }
    if (name === "call_ended") {
      return { text: "finishing", css: "muted" };
    }
    return { text: "running", css: "running" };
  }
  function showPending(name, d) {
    var id = String(d.liveId);
    if (finished[id]) {
      return;
    }
    var row = pending[id];
    if (!row) {
      if (name === "call_ended") {
        return;
      }
      var tail = document.getElementById("tail");
      if (!tail) {
        return;
      }
      row = document.createElement("div");
      row.className = "call pending";
      row.id = "live-" + id;
      var summary = document.createElement("div");
      summary.className = "summary";
      row.appendChild(summary);
      tail.parentNode.insertBefore(row, tail);
      pending[id] = row;
    }
    var key = pendingKey(d);
    if (key) {
      row.setAttribute("data-key", key);
    }
    if (name === "call_ended") {
      row.setAttribute("data-ended", "1");
    }
    var state = stateOf(name, d);
    row.setAttribute("data-state", state.css);
    var summary = row.firstChild;
    summary.textContent = "";
    summary.appendChild(cell("mono muted", d.time ? d.time.substring(11, 19) : ""));
    summary.appendChild(cell("mono", d.tool));
    summary.appendChild(cell("", d.workspace || "\u2014"));
    var target = cell("mono target", d.target || "");
    target.title = d.target || "";
    summary.appendChild(target);
    summary.appendChild(cell("muted", d.decidedBy || ""));
    summary.appendChild(cell("mono muted", ""));
    summary.appendChild(cell("state " + state.css, state.text));
  }
  // A call's record arrived: its pending row goes once the refresh shows the record.
  function recorded(d) {
    var key = d.time + "\u0000" + d.tool + "\u0000" + d.target;
    for (var id in pending) {
      if (pending[id].getAttribute("data-key") === key && !pending[id].hasAttribute("data-done")) {
        pending[id].setAttribute("data-done", "1");
        return;
      }
    }
  }
  function dropRecorded(all) {
    for (var id in pending) {
      var row = pending[id];
      var unmatched = row.hasAttribute("data-ended") && !row.hasAttribute("data-key");
      if (all || row.hasAttribute("data-done") || unmatched) {
        row.parentNode && row.parentNode.removeChild(row);
        delete pending[id];
        finished[id] = true;
      }
    }
  }
  var busy = false;
  var again = false;
  // After an answer that failed: one later try at a time, each further off (2 s to a minute).
  var retry = null;
  var retryAfter = 2000;
  function refreshCalls() {
    var tail = document.getElementById("tail");
    if (!tail) {
      return;
    }
    if (busy) {
      again = true;
      return;
    }
    if (retry !== null) {
      clearTimeout(retry);
      retry = null;
    }
    busy = true;
    var asked = tail.getAttribute("data-src");
    var behind = tail.hasAttribute("data-more");
    function answered() {
      busy = false;
      dropRecorded(false);
      keepPendingLast();
      markDiffs();
      var count = document.getElementById("call-count");
      var fresh = document.getElementById("tail");
      if (count && fresh) {
        count.textContent = fresh.getAttribute("data-total");
      }
      var moved = fresh && fresh.getAttribute("data-src") !== asked;
      if (!moved) {
        // The answer failed (the old tail is still there): asked again later when something
        // was still to come, not at once and not never.
        if (again || behind) {
          again = false;
          retry = setTimeout(function () {
            retry = null;
            refreshCalls();
          }, retryAfter);
          retryAfter = Math.min(retryAfter * 2, 60000);
        }
        return;
      }
      retryAfter = 2000;
      // A page of calls at a time: ask again while the tail says more are there.
      if (again || fresh.hasAttribute("data-more")) {
        again = false;
        refreshCalls();
      }
    }
    htmx
      .ajax("GET", asked, { target: "#tail", swap: "outerHTML" })
      .then(answered, answered);
  }
  function refreshConversation() {
    var c = document.getElementById("conversation");
    if (c) {
      htmx.ajax("GET", c.getAttribute("data-src"), { target: "#conversation", swap: "innerHTML" });
    }
  }
  var events = new EventSource(root.getAttribute("data-events"));
  events.addEventListener("ready", function () {
    document.body.setAttribute("data-live", "on");
  });
  // Rows of calls still in progress stay after the recorded ones.
  function keepPendingLast() {
    var tail = document.getElementById("tail");
    if (!tail) {
      return;
    }
    for (var id in pending) {
      tail.parentNode.insertBefore(pending[id], tail);
    }
  }
  ["call_started", "call_waiting", "call_decided", "call_ended"].forEach(function (name) {
    events.addEventListener(name, function (e) {
      showPending(name, JSON.parse(e.data));
    });
  });
  events.addEventListener("call", function (e) {
    recorded(JSON.parse(e.data));
    refreshCalls();
  });
  // A call's diff may be stored a moment after its audit line: its row is marked when the
  // diff's event comes, whether the row is on the page yet or arrives with the next refresh.
  var diffs = {};
  function markDiffs() {
    var rows = document.querySelectorAll("details.call");
    for (var i = 0; i < rows.length; i++) {
      if (!diffs[rows[i].getAttribute("data-call")]) {
        continue;
      }
      var outcome = rows[i].querySelector("summary > span:last-child");
      if (outcome && !outcome.querySelector(".badge")) {
        var badge = document.createElement("span");
        badge.className = "badge";
        badge.textContent = "diff";
        outcome.appendChild(document.createTextNode(" "));
        outcome.appendChild(badge);
      }
    }
  }
  events.addEventListener("artifact", function (e) {
    var artifact = JSON.parse(e.data);
    if (artifact.artifactType === "file_diff" && artifact.callId) {
      diffs[artifact.callId] = true;
      markDiffs();
    }
  });
  events.addEventListener("message", refreshConversation);
  events.addEventListener("history", refreshConversation);
  events.addEventListener("lagged", function () {
    // Missed events: the rows of calls in progress may be stale; the log says what ended.
    dropRecorded(true);
    refreshCalls();
    refreshConversation();
  });
  events.onerror = function () {
    document.body.setAttribute("data-live", "off");
  };
})();
