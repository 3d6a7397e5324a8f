// course website: a figure drawn wider than the text column is shown shrunk; make it a link to
// the image at its full size (the file is part of the site, nothing is fetched from elsewhere)
window.addEventListener("load", () => {
  for (const img of document.querySelectorAll("div.cell_output img")) {
    if (img.closest("a") || img.naturalWidth <= img.clientWidth * 1.1) continue;
    const a = document.createElement("a");
    a.href = img.currentSrc || img.src;
    a.title = `shown at ${Math.round(100 * img.clientWidth / img.naturalWidth)} % - click for full size`;
    a.className = "full-size-figure";
    img.replaceWith(a);
    a.appendChild(img);
  }
});
