// Loads a Chrome trace event JSON file with Chrome DevTools' own trace
// engine (the model behind its performance panel) and prints, as JSON,
// the thread tracks it built: per process and thread, the thread's name
// and its events (name, start and duration in microseconds, site, and
// the holds a merged span stands for).
import {analyzeTrace} from '@paulirish/trace_engine/analyze-trace.mjs';

const {parsedTrace} = await analyzeTrace(process.argv[2]);
const data = parsedTrace.data ?? parsedTrace;
const processes = [];
for (const [pid, proc] of data.Renderer.processes) {
  const threads = [];
  for (const [tid, thread] of proc.threads) {
    threads.push({
      tid,
      name: thread.name ?? null,
      events: (thread.entries ?? []).map(e => ({
        name: e.name,
        ts: e.ts,
        dur: e.dur ?? null,
        site: e.args?.site ?? null,
        holds: e.args?.holds ?? null,
      })),
    });
  }
  processes.push({pid, threads});
}
process.stdout.write(JSON.stringify({
  processes,
  bounds: {min: data.Meta.traceBounds.min, max: data.Meta.traceBounds.max},
}));
