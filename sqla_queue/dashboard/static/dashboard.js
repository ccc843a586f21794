// sqla_queue dashboard: confirmation of actions and the auto-refresh. No other script.
"use strict";
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
(function () {
  var seconds = parseFloat(document.body.getAttribute("data-refresh") || "");
  if (!(seconds >= 1)) {
    return;
  }
  setInterval(function () {
    // Never reload under someone typing a limit, or while a dialog is up.
    var active = document.activeElement;
    if (active && (active.tagName === "INPUT" || active.tagName === "SELECT")) {
      return;
    }
    window.location.reload();
  }, seconds * 1000);
})();
