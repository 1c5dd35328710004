// A source page of the course site (tools/site/build.py): #L12 marks line
// 12, #L12-L20 lines 12 to 20 (GitHub's form, as the lessons' references
// `path:12-20` link them), and scrolls to the first.
(function () {
  function mark() {
    var old = document.querySelectorAll('.line.hit');
    for (var i = 0; i < old.length; i++) old[i].classList.remove('hit');
    var m = /^#L(\d+)(?:-L(\d+))?$/.exec(location.hash);
    if (!m) return;
    var lo = +m[1], hi = m[2] ? +m[2] : lo;
    for (var n = lo; n <= hi; n++) {
      var el = document.getElementById('L' + n);
      if (el) el.classList.add('hit');
    }
    var first = document.getElementById('L' + lo);
    if (first && m[2]) first.scrollIntoView({block: 'start'});
  }
  window.addEventListener('hashchange', mark);
  mark();
})();
