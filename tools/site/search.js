// The course site's search (tools/site/build.py writes window.SITE_INDEX:
// [page, anchor, doc title, section title, text] per section of every doc,
// and one entry per source file). Every word typed must appear in the
// section (or its titles); sections whose headings hold the words come first.
(function () {
  'use strict';
  var q = document.getElementById('q'), hits = document.getElementById('hits');
  var index = (window.SITE_INDEX || []).map(function (e) {
    return {e: e, head: (e[2] + ' ' + e[3]).toLowerCase(), body: e[4].toLowerCase()};
  });
  function snippet(text, word) {
    var i = text.toLowerCase().indexOf(word);
    if (i < 0) return text.slice(0, 140);
    var a = Math.max(0, i - 60);
    return (a ? '…' : '') + text.slice(a, i + 100) + '…';
  }
  function run() {
    var words = q.value.toLowerCase().split(/\s+/).filter(function (w) { return w.length > 1; });
    hits.textContent = '';
    if (!words.length) return;
    var found = [];
    index.forEach(function (x) {
      var score = 0;
      for (var k = 0; k < words.length; k++) {
        var inHead = x.head.indexOf(words[k]) >= 0;
        if (!inHead && x.body.indexOf(words[k]) < 0) return;
        score += inHead ? 10 : 1;
      }
      found.push({x: x, score: score});
    });
    found.sort(function (a, b) { return b.score - a.score; });
    found.slice(0, 60).forEach(function (f) {
      var e = f.x.e, li = document.createElement('li'), a = document.createElement('a');
      a.href = e[0] + (e[1] ? '#' + e[1] : '');
      a.textContent = e[2] + (e[3] && e[3] !== e[2] ? ' › ' + e[3] : '');
      li.appendChild(a);
      if (e[4]) {
        var p = document.createElement('div');
        p.className = 'snippet';
        p.textContent = snippet(e[4], words[0]);
        li.appendChild(p);
      }
      hits.appendChild(li);
    });
    if (!found.length) hits.innerHTML = '<li>Nothing holds all of these words.</li>';
    else if (found.length > 60) {
      var more = document.createElement('li');
      more.textContent = (found.length - 60) + ' more: add a word.';
      hits.appendChild(more);
    }
  }
  q.addEventListener('input', run);
  if (location.hash.indexOf('#q=') === 0) q.value = decodeURIComponent(location.hash.slice(3));
  run();
})();
