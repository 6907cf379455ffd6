// Line icons as inline SVG (drawn here rather than emoji: a machine without an emoji font shows boxes).
const PATHS = {
  plus: "M12 5v14M5 12h14",
  pencil: "M4 20h4L19 9l-4-4L4 16v4zM13.5 6.5l4 4",
  trash: "M4 7h16M9 7V4h6v3M6 7l1 13h10l1-13M10 11v6M14 11v6",
  copy: "M9 9h11v11H9zM5 15H4V4h11v1",
  up: "M7 11v9H4v-9h3zm0 0 4-7c1.4 0 2.4 1.1 2 2.6L12 10h6.2c1.1 0 1.9 1 1.7 2.1l-1.4 6.6c-.2.8-.9 1.3-1.7 1.3H7",
  down: "M17 13V4h3v9h-3zm0 0-4 7c-1.4 0-2.4-1.1-2-2.6l1-3.4H5.8c-1.1 0-1.9-1-1.7-2.1l1.4-6.6C5.7 4.5 6.4 4 7.2 4H17",
  regenerate: "M20 12a8 8 0 1 1-2.3-5.7M20 4v5h-5",
  menu: "M4 6h16M4 12h16M4 18h16",
  close: "M6 6l12 12M18 6 6 18",
  moon: "M20 14.5A8 8 0 1 1 9.5 4a6.5 6.5 0 0 0 10.5 10.5z",
  sun: "M12 8a4 4 0 1 0 0 8 4 4 0 0 0 0-8zM12 2v2M12 20v2M4.9 4.9l1.4 1.4M17.7 17.7l1.4 1.4M2 12h2M20 12h2M4.9 19.1l1.4-1.4M17.7 6.3l1.4-1.4",
  stop: "M7 7h10v10H7z",
  send: "M12 19V5M6 11l6-6 6 6",
  pin: "M12 16v6M8 3h8l-1 6 3 4H6l3-4z",
  archive: "M3 4h18v4H3zM5 8v12h14V8M10 12h4",
  attach: "M21 11.5l-8.5 8.5a5 5 0 0 1-7-7L14 4.5a3.5 3.5 0 0 1 5 5L10.5 18a2 2 0 0 1-3-3L15 7.5",
};

/** An <svg> for one icon, hidden from screen readers (its button carries the label). */
export function icon(name) {
  const template = document.createElement("template");
  template.innerHTML =
    `<svg class="ico" viewBox="0 0 24 24" width="18" height="18" aria-hidden="true" focusable="false" fill="none" ` +
    `stroke="currentColor" stroke-width="1.8" stroke-linecap="round" stroke-linejoin="round"><path d="${PATHS[name]}"/></svg>`;
  return template.content.firstElementChild;
}

/** Put icons into the static page's buttons marked data-icon="name". */
export function drawIcons(root = document) {
  for (const el of root.querySelectorAll("[data-icon]")) el.prepend(icon(el.dataset.icon));
}
