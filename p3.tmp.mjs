import { generateDocument } from './dist/bench/generate.js';
import { loadDocument, diffSpecs } from './dist/src/spec/index.js';
const doc = generateDocument(10000, 3);
const s = loadDocument(JSON.stringify(doc),'json');
const doc2 = structuredClone(doc); doc2.spec.services[5000].replicas[1].ssh.port=2222;
const s3 = loadDocument(JSON.stringify(doc2),'json');
const ts=[];
for (let k=0;k<20;k++){ const t=performance.now(); diffSpecs(s,s3); ts.push(performance.now()-t);}
ts.sort((a,b)=>a-b); console.log('diff median', ts[10].toFixed(1), 'min', ts[0].toFixed(1));
import { deepEqual } from './dist/src/spec/diff.js';
const a=s.spec.services, b=s3.spec.services; const t2=[];
for (let k=0;k<20;k++){ const t=performance.now(); let n=0; for (let i=0;i<a.length;i++) if(!deepEqual(a[i],b[i])) n++; t2.push(performance.now()-t);}
t2.sort((x,y)=>x-y); console.log('deepEqual loop median', t2[10].toFixed(1));
const t3=[];
for (let k=0;k<20;k++){ const t=performance.now(); const m=new Map(); for (const x of a) m.set(x.project+'/'+x.run, x); const m2=new Map(); for (const x of b) m2.set(x.project+'/'+x.run, x); let c=0; for (const [k2,v] of m) if (m2.get(k2)) c++; t3.push(performance.now()-t);}
t3.sort((x,y)=>x-y); console.log('maps median', t3[10].toFixed(1));
