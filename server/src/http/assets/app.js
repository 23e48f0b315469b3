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
