// Building the page from data without ever parsing it as HTML: every text
// the server sends goes in through textContent, so a thread named
// "<script>" stays text (the Content-Security-Policy forbids inline scripts too).

type Child = Node | string | number | undefined | null | false;

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attributes: Record<string, string | undefined> = {},
                                                        ...children: Child[]): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) if (value !== undefined) element.setAttribute(name, value);
  append(element, children);
  return element;
}

const SVG = "http://www.w3.org/2000/svg";

export function s(tag: string, attributes: Record<string, string | number> = {}, ...children: Child[]): SVGElement {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, String(value));
  append(element, children);
  return element;
}

function append(element: Element, children: Child[]): void {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    element.append(typeof child === "number" ? String(child) : child);
  }
}

/** Replaces what `element` holds. */
export function fill(element: Element, ...children: Child[]): void {
  element.replaceChildren();
  append(element, children);
}

/** An enum value's name without its prefix: MULTI_AGENT_MODE_PROACTIVE → proactive. */
export function label(names: Record<number, string>, value: number | undefined, prefix: string): string {
  if (value === undefined) return "—";
  const name = names[value] ?? String(value);
  return name.startsWith(prefix) ? name.slice(prefix.length).toLowerCase().replaceAll("_", " ") : name;
}

/** A time the server reports (Unix milliseconds). */
export function when(milliseconds: bigint | undefined): string {
  if (milliseconds === undefined) return "—";
  return new Date(Number(milliseconds)).toLocaleString();
}
