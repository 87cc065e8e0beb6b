import { generateDocument } from './dist/bench/generate.js';
import { loadDocument, hashSpec, diffSpecs } from './dist/src/spec/index.js';
import { stringify } from 'yaml';
const doc = generateDocument(10000, 3);
const json = JSON.stringify(doc); const yaml = stringify(doc);
console.log('json bytes', json.length, 'yaml bytes', yaml.length);
for (let k=0;k<3;k++){
let t=performance.now(); const s = loadDocument(json,'json'); const h = hashSpec(s); console.log('json', (performance.now()-t).toFixed(0),'ms');
t=performance.now(); const s2 = loadDocument(yaml,'yaml'); hashSpec(s2); console.log('yaml', (performance.now()-t).toFixed(0),'ms');
const doc2 = structuredClone(doc); doc2.spec.services[5000].replicas[1].ssh.port=2222;
const s3 = loadDocument(JSON.stringify(doc2),'json');
t=performance.now(); const d = diffSpecs(s, s3); console.log('diff', (performance.now()-t).toFixed(1),'ms', JSON.stringify(d.changes));
}
console.log('rss', process.memoryUsage().rss/2**20);
