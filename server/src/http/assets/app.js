// The web view's only script: follow a session's events and refresh what they change.
// (No inline scripts anywhere: the pages' Content-Security-Policy allows only these files.)
(function () {
  "use strict";
  var root = document.querySelector("[data-events]");
  if (!root) {
    return;
  }
  var busy = false;
  var again = false;
  function refreshCalls() {
    var tail = document.getElementById("tail");
    if (!tail) {
      return;
    }
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    htmx
      .ajax("GET", tail.getAttribute("data-src"), { target: "#tail", swap: "outerHTML" })
      .then(function () {
        busy = false;
        markDiffs();
        var count = document.getElementById("call-count");
        var fresh = document.getElementById("tail");
        if (count && fresh) {
          count.textContent = fresh.getAttribute("data-total");
        }
        if (again) {
          again = false;
          refreshCalls();
        }
      });
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
  events.addEventListener("call", refreshCalls);
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
    refreshCalls();
    refreshConversation();
  });
  events.onerror = function () {
    document.body.setAttribute("data-live", "off");
  };
})();
