(function () {
  "use strict";
  var box = document.getElementById("filter");
  var count = document.getElementById("filter-count");
  if (!box) { return; }
  var items = Array.prototype.slice.call(document.querySelectorAll("[data-f]"));
  function apply() {
    var words = box.value.toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0;
    items.forEach(function (el) {
      var text = el.getAttribute("data-f");
      var hit = words.every(function (w) { return text.indexOf(w) >= 0; });
      el.hidden = !hit;
      if (hit) { shown += 1; }
    });
    count.textContent = words.length ? shown + " of " + items.length + " entries match" : "";
  }
  box.addEventListener("input", apply);
  apply();
})();
