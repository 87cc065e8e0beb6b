// Types of scripts/layering.mjs, for the test that imports it.

export interface Layer {
  name: string;
  paths: string[];
  holds: string;
  mayImport: string[];
}
export interface Edge {
  from: string;
  to: string;
  specifier: string;
  typeOnly: boolean;
}
export interface Violation {
  from: string;
  to: string;
  rule: string;
  units?: string[];
}
export interface KnownViolation {
  from: string;
  to: string;
  why: string;
}
export interface KnownCycle {
  units: string[];
  why: string;
}

export const LAYERS: Layer[];
export const KNOWN_VIOLATIONS: KnownViolation[];
export const KNOWN_CYCLES: KnownCycle[];
export const ROOT: string;
export const README_BEGIN: string;
export const README_END: string;

export function sourceFiles(root?: string, dir?: string): string[];
export function importsOf(fileName: string, text: string): { specifier: string; typeOnly: boolean }[];
export function resolveSpecifier(from: string, specifier: string, root?: string): string;
export function importGraph(root?: string): Edge[];
export function placeOf(file: string, layers?: Layer[]): { layer: Layer; unit: string } | undefined;
export function violations(edges: Edge[], layers?: Layer[]): Violation[];
export function cycles(pairs: string[][]): string[][];
export function check(
  edges?: Edge[],
  layers?: Layer[],
  known?: KnownViolation[],
  knownCycles?: KnownCycle[],
): { violations: Violation[]; stale: string[] };
export function formatViolation(v: Violation): string;
export function renderTable(layers?: Layer[]): string;
export function readmeTable(text?: string): string | undefined;
