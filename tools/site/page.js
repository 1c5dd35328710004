// A lesson or topic page of the course site (tools/site/build.py): on a
// wide screen the contents stand open beside the text (site.css places
// them); the left and right arrow keys go to the previous and next lesson.
(function () {
  'use strict';
  var toc = document.querySelector('details.toc');
  var wide = window.matchMedia('(min-width: 84rem)');
  function place() { if (toc) toc.open = wide.matches; }
  if (wide.addEventListener) wide.addEventListener('change', place);
  place();
  document.addEventListener('keydown', function (ev) {
    if (ev.altKey || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;
    var t = ev.target.tagName;
    if (t === 'INPUT' || t === 'TEXTAREA' || t === 'SELECT') return;
    var a = document.querySelector(ev.key === 'ArrowLeft' ? 'nav.top a.prev' : ev.key === 'ArrowRight' ? 'nav.top a.next' : null);
    if (a) location.href = a.href;
  });
})();
