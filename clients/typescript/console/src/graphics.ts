// Drawn by hand in SVG (no chart or graph library): an agent tree and a bar chart.
import { s } from "./dom.js";

export interface TreeNode {
  id: string;
  title: string;
  detail: string;
  status: string;
  children: TreeNode[];
}

const NODE_WIDTH = 190;
const NODE_HEIGHT = 58;
const GAP_X = 24;
const GAP_Y = 46;

/** The tree laid out top-down: leaves side by side, a parent centred over its children. */
export function agentTree(root: TreeNode, open: (id: string) => void, current?: string): SVGElement {
  const positions = new Map<TreeNode, { x: number; y: number }>();
  let nextLeaf = 0;
  let depthMax = 0;
  const place = (node: TreeNode, depth: number): number => {
    depthMax = Math.max(depthMax, depth);
    let x: number;
    if (node.children.length === 0) {
      x = nextLeaf++ * (NODE_WIDTH + GAP_X);
    } else {
      const xs = node.children.map((child) => place(child, depth + 1));
      x = (xs[0] + xs[xs.length - 1]) / 2;
    }
    positions.set(node, { x, y: depth * (NODE_HEIGHT + GAP_Y) });
    return x;
  };
  place(root, 0);
  const width = Math.max(1, nextLeaf) * (NODE_WIDTH + GAP_X);
  const height = (depthMax + 1) * (NODE_HEIGHT + GAP_Y);
  const svg = s("svg", { viewBox: `-4 -4 ${width + 8} ${height + 8}`, width: width + 8, height: height + 8, role: "img",
                         "aria-label": "agent tree", class: "tree", "data-testid": "agent-tree" });
  for (const [node, at] of positions) {
    for (const child of node.children) {
      const to = positions.get(child)!;
      svg.append(s("path", { class: "edge", d: `M${at.x + NODE_WIDTH / 2},${at.y + NODE_HEIGHT} C${at.x + NODE_WIDTH / 2},${at.y + NODE_HEIGHT + GAP_Y / 2} ${to.x + NODE_WIDTH / 2},${to.y - GAP_Y / 2} ${to.x + NODE_WIDTH / 2},${to.y}` }));
    }
  }
  for (const [node, at] of positions) {
    const group = s("g", { class: `node status-${node.status.replaceAll(" ", "-")}${node.id === current ? " current" : ""}`,
                           transform: `translate(${at.x},${at.y})`, tabindex: 0, role: "link",
                           "data-thread-id": node.id, "data-status": node.status },
      s("title", {}, `${node.title} (${node.id})`),
      s("rect", { width: NODE_WIDTH, height: NODE_HEIGHT, rx: 8 }),
      s("text", { x: 10, y: 20, class: "node-title" }, clip(node.title, 24)),
      s("text", { x: 10, y: 36, class: "node-detail" }, clip(node.detail, 28)),
      s("text", { x: 10, y: 51, class: "node-status" }, node.status));
    group.addEventListener("click", () => open(node.id));
    group.addEventListener("keydown", (event) => {
      if ((event as KeyboardEvent).key === "Enter") open(node.id);
    });
    svg.append(group);
  }
  return svg;
}

/** Bars with their value above and their label below. */
export function barChart(values: Array<{ label: string; value: number }>, caption: string): SVGElement {
  const barWidth = 28;
  const gap = 10;
  const height = 120;
  const max = Math.max(1, ...values.map((v) => v.value));
  const width = Math.max(1, values.length) * (barWidth + gap) + gap;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height + 34}`, width, height: height + 34, role: "img",
                         "aria-label": caption, class: "chart", "data-testid": "usage-chart" });
  values.forEach((v, index) => {
    const barHeight = Math.round((v.value / max) * height);
    const x = gap + index * (barWidth + gap);
    svg.append(
      s("rect", { x, y: height - barHeight + 14, width: barWidth, height: Math.max(1, barHeight), class: "bar" },
        s("title", {}, `${v.label}: ${v.value} tokens`)),
      s("text", { x: x + barWidth / 2, y: height - barHeight + 10, class: "bar-value", "text-anchor": "middle" }, String(v.value)),
      s("text", { x: x + barWidth / 2, y: height + 28, class: "bar-label", "text-anchor": "middle" }, v.label));
  });
  return svg;
}

function clip(text: string, length: number): string {
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}
