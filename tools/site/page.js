// A lesson or topic page of the course site (tools/site/build.py): on a
// wide screen the contents stand open beside the text (site.css places
// them); the left and right arrow keys go to the previous and next lesson,
// but where they scroll what was last clicked (a wide code block or table).
(function () {
  'use strict';
  var toc = document.querySelector('details.toc');
  var wide = window.matchMedia('(min-width: 84rem)');
  function place() { if (toc) toc.open = wide.matches; }
  if (wide.addEventListener) wide.addEventListener('change', place);
  place();
  // the browser sends the arrows to the element last clicked: one that
  // scrolls sideways keeps them
  var clicked = null;
  document.addEventListener('pointerdown', function (ev) { clicked = ev.target; });
  function scrollsSideways(el) {
    for (; el && el !== document.body && el.nodeType === 1; el = el.parentElement) {
      var o = getComputedStyle(el).overflowX;
      if ((o === 'auto' || o === 'scroll') && el.scrollWidth > el.clientWidth) return true;
    }
    return false;
  }
  document.addEventListener('keydown', function (ev) {
    if (ev.altKey || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.defaultPrevented) return;
    var t = ev.target.tagName;
    if (t === 'INPUT' || t === 'TEXTAREA' || t === 'SELECT') return;
    if (scrollsSideways(clicked)) return;
    var a = document.querySelector(ev.key === 'ArrowLeft' ? 'nav.top a.prev' : ev.key === 'ArrowRight' ? 'nav.top a.next' : null);
    if (a) location.href = a.href;
  });
})();
