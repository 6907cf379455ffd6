// Builds the app into dist/: one JS bundle and one stylesheet with content-hashed names, and index.html naming
// them (so the edge can cache assets forever and the page never mixes versions). `npm run build`.
import { readFile, rm, writeFile } from "node:fs/promises";
import { basename } from "node:path";
import * as esbuild from "esbuild";

const outdir = "dist";
await rm(outdir, { recursive: true, force: true });
const result = await esbuild.build({
  entryPoints: { app: "src/main.js", style: "src/style.css" },
  bundle: true,
  minify: true,
  sourcemap: true,
  format: "esm",
  target: ["chrome109", "firefox115", "safari16"],
  entryNames: "[name]-[hash]",
  outdir,
  metafile: true,
  logLevel: "warning",
});
const outputs = Object.keys(result.metafile.outputs).map((path) => basename(path));
const js = outputs.find((name) => name.startsWith("app-") && name.endsWith(".js"));
const css = outputs.find((name) => name.startsWith("style-") && name.endsWith(".css"));
const page = (await readFile("index.html", "utf8"))
  .replace("%APP_JS%", js)
  .replace("%APP_CSS%", css);
await writeFile(`${outdir}/index.html`, page);
const bytes = Object.values(result.metafile.outputs).reduce((sum, out) => sum + out.bytes, 0);
console.log(
  `web: built ${js} and ${css} (${Math.round(bytes / 1024)} KiB with source maps) into ${outdir}/`,
);
