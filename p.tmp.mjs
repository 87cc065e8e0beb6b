import { generateDocument } from './dist/bench/generate.js';
import { schemaIssues } from './dist/src/spec/schema-check.js';
import { semanticIssues } from './dist/src/spec/semantic.js';
import { normalise } from './dist/src/spec/normalise.js';
import { hashSpec } from './dist/src/spec/hash.js';
import { parseDocument } from './dist/src/spec/parse.js';
const doc = generateDocument(10000, 3);
const json = JSON.stringify(doc);
for (let k=0;k<3;k++){
let t=performance.now(); const d = parseDocument(json,'json'); const t1=performance.now();
schemaIssues(d); const t2=performance.now(); semanticIssues(d); const t3=performance.now(); const s=normalise(d); const t4=performance.now(); hashSpec(s); const t5=performance.now();
console.log('parse',(t1-t).toFixed(0),'schema',(t2-t1).toFixed(0),'sem',(t3-t2).toFixed(0),'norm',(t4-t3).toFixed(0),'hash',(t5-t4).toFixed(0));
}
