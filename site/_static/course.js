// course website, on load:
// 1. a figure drawn wider than the text column is shown shrunk; make it a link to the image at its
//    full size (the file is part of the site, nothing is fetched from elsewhere);
// 2. on a narrow screen (a phone) a figure is never shown below MIN_SCALE of the size it was drawn
//    (its 10 pt labels would be about 5 px): its box scrolls sideways instead;
// 3. every output wider than its box (a wide table, such a figure) gets a visible cue.
const MIN_SCALE = 0.75;
const PHONE = window.matchMedia("(max-width: 46em)");
function courseLayout() {
  for (const img of document.querySelectorAll("div.cell_output img")) {
    if (!img.naturalWidth) continue;
    if (PHONE.matches && img.clientWidth < MIN_SCALE * img.naturalWidth) {
      img.classList.add("phone-scaled");
      img.style.width = `${Math.round(MIN_SCALE * img.naturalWidth)}px`;
    }
    if (img.closest("a") || img.naturalWidth <= img.clientWidth * 1.1) continue;
    const a = document.createElement("a");
    a.href = img.currentSrc || img.src;
    a.title = `shown at ${Math.round(100 * img.clientWidth / img.naturalWidth)} % - click for full size`;
    a.className = "full-size-figure";
    img.replaceWith(a);
    a.appendChild(img);
  }
  for (const box of document.querySelectorAll("div.cell_output, div.cell_output div.output")) {
    if (box.scrollWidth <= box.clientWidth + 1 || box.classList.contains("scrolls-x")) continue;
    box.classList.add("scrolls-x");
    const cue = document.createElement("p");
    cue.className = "scroll-cue";
    cue.textContent = "\u2194 wider than the page: scroll sideways in this box";
    box.before(cue);
  }
}
window.addEventListener("load", courseLayout);
