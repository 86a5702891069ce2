"""kmock's KubernetesEmulator on 127.0.0.1, with only what it lacks for the
spoke's kube backend tests:

- resourceVersion (one counter) stamped on every write, plus uid and
  creationTimestamp on creation;
- list answers with that resourceVersion, kind/apiVersion, and equality
  label selectors (`a=b`, `a!=b`, `a`, `!a`);
- watch from a resourceVersion replays the writes after it (kmock itself
  replays every object as ADDED on each watch);
- server-side apply to a missing object creates it (kmock 404s a PATCH of a
  missing object); apply itself stays kmock's dict merge (no field managers,
  no conflicts);
- `pods/log` answers the simulated log, honouring `tailLines` (kmock would
  answer the pod);
- error Statuses carry kube-apiserver's reasons (`NotFound`, `AlreadyExists`);
- `/api/v1/namespaces[/NAME]` is the Namespace resource (kmock reads it as a
  namespace prefix with no resource).

- `COMPACT` on stdin forgets the write history: a watch from an older
  resourceVersion gets a 410 `Expired` ERROR event, as after etcd compaction;
- `CLOSE_WATCHES` on stdin ends every open watch stream.

Prints `PORT <n>` once serving, `OK` after each stdin command; exits when
stdin closes.
"""

import asyncio
import copy
import datetime
import json
import sys
import uuid

import kmock
from kmock._internal import enums, parsing, rendering

RESOURCES = [
    'v1/namespaces', 'v1/nodes', 'v1/pods', 'v1/configmaps', 'v1/secrets', 'v1/services',
    'v1/events', 'batch/v1/jobs', 'jobset.x-k8s.io/v1alpha2/jobsets',
    'scheduling.x-k8s.io/v1alpha1/podgroups', 'scheduling.volcano.sh/v1beta1/podgroups',
]
KINDS = {
    'namespaces': 'Namespace', 'nodes': 'Node', 'pods': 'Pod', 'configmaps': 'ConfigMap',
    'secrets': 'Secret', 'services': 'Service', 'events': 'Event', 'jobs': 'Job',
    'jobsets': 'JobSet', 'podgroups': 'PodGroup',
}


def now():
    return datetime.datetime.now(tz=datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def selector_matches(selector, labels):
    for term in filter(None, (t.strip() for t in selector.split(','))):
        if '!=' in term:
            k, v = term.split('!=', 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif '=' in term:
            k, v = term.split('=', 1)
            if labels.get(k.strip().rstrip('=')) != v.strip().lstrip('='):
                return False
        elif term.startswith('!'):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def pod_log(pod):
    containers = pod.get('spec', {}).get('containers', [])
    for env in (containers[0].get('env', []) if containers else []):
        if env.get('name') == 'STANDIN_LOG' and 'value' in env:
            text = env['value']
            return text if text.endswith('\n') else text + '\n'
    meta = pod.get('metadata', {})
    name, node = meta.get('name', ''), pod.get('spec', {}).get('nodeName', '')
    index = meta.get('annotations', {}).get('batch.kubernetes.io/job-completion-index', '0')
    return f"pod {name} started on node {node}\npod {name}: completion index {index}\npod {name}: done\n"


def parse_path(path):
    """kmock reads `/api/v1/namespaces[/NAME[/SUB]]` as a namespace with no
    resource (and fails on the bare collection); read it as the Namespace
    resource, as kube-apiserver does."""
    parts = path.strip('/').split('/')
    namespace_path = len(parts) in (3, 4) or (len(parts) == 5 and parts[4] in ('status', 'finalize'))
    if parts[:1] == ['api'] and namespace_path and parts[2] == 'namespaces':
        return parsing.ParsedPath(group='', version=parts[1], plural='namespaces',
                                  name=parts[3] if len(parts) > 3 else None,
                                  subresource=parts[4] if len(parts) > 4 else None)
    return kmock_parse_path(path)


kmock_parse_path = parsing.parse_path
parsing.parse_path = parse_path


class Wrapped(kmock.KubernetesEmulator):
    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        self.rv = 0
        self.history = []  # (rv, resource, {'type', 'object'})
        self.compacted = 0  # watches from before this resourceVersion get 410
        self.closing = asyncio.Event()  # set (and replaced) by close_watches
        for r in RESOURCES:
            self.resources[r] = {}

    def _next(self):
        self.rv += 1
        return str(self.rv)

    async def _handle(self, request):
        if request.resource is None:
            return await super()._handle(request)
        key = (request.resource, request.namespace, request.name)
        data = request.data if isinstance(request.data, dict) else None
        event = None
        if request.action == enums.action.CREATE and data is not None:
            meta = data.setdefault('metadata', {})
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), resourceVersion=self._next())
            if request.namespace:
                meta['namespace'] = request.namespace
            event = 'ADDED'
        elif request.action == enums.action.UPDATE and data is not None:
            data.setdefault('metadata', {})['resourceVersion'] = self._next()
            apply = request.headers.get('Content-Type', '').startswith('application/apply-patch')
            missing = key not in self.objects or self.objects[key].deleted
            if apply and missing:
                data['metadata'].update(uid=str(uuid.uuid4()), creationTimestamp=now(),
                                        name=request.name, namespace=request.namespace)
                async with self._lock:
                    if key in self.objects:
                        self.objects[key].create(data)
                    else:
                        self.objects[key] = data
                self._record('ADDED', request.resource, self.objects[key].raw)
                return await self._respond(copy.deepcopy(self.objects[key].raw), 201)
            event = 'MODIFIED'
        elif request.action == enums.action.DELETE and request.name is not None:
            event = 'DELETED'
        elif request.action == enums.action.FETCH and request.subresource == 'log':
            obj = self.objects[key] if key in self.objects else None
            if obj is None or obj.deleted:
                raise kmock.KubernetesObjectNotFoundError()
            text = pod_log(obj.raw)
            tail = request.params.get('tailLines')
            if tail is not None and tail.isdigit():
                lines = text.splitlines(keepends=True)
                text = ''.join(lines[len(lines) - min(int(tail), len(lines)):])
            return await self._respond(text, 200)
        response = await super()._handle(request)
        if event is not None and key[2] is None and data is not None:
            key = (request.resource, request.namespace or data['metadata'].get('namespace'),
                   data['metadata'].get('name'))
        if event is not None and response.status < 300:
            obj = self.objects[key] if key in self.objects else None
            if obj is not None:
                raw = copy.deepcopy(obj.last.raw if event == 'DELETED' else obj.raw)
                if event == 'DELETED':
                    raw.setdefault('metadata', {})['resourceVersion'] = self._next()
                self._record(event, request.resource, raw)
        return response

    async def _render_error(self, exc):
        # Status reasons as kube-apiserver names them (clients branch on
        # them: kube-rs's get_opt reads `NotFound`); kmock words them freely.
        reasons = {404: 'NotFound', 409: 'AlreadyExists', 422: 'Invalid'}
        if isinstance(exc, kmock.KubernetesError) and exc.status in reasons:
            return await self._respond({
                'apiVersion': 'v1', 'kind': 'Status', 'metadata': {}, 'status': 'Failure',
                'code': exc.status, 'reason': reasons[exc.status],
                'message': exc.message or repr(exc)}, exc.status)
        return await super()._render_error(exc)

    def _record(self, type_, resource, raw):
        self.history.append((int(raw['metadata']['resourceVersion']), resource, {'type': type_, 'object': raw}))

    async def _respond(self, payload, status):
        import aiohttp.web
        if isinstance(payload, str):
            return aiohttp.web.Response(text=payload, status=status)
        return aiohttp.web.json_response(payload, status=status)

    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        selector = request.params.get('labelSelector')
        items = result['items']
        if selector:
            items = [o for o in items if selector_matches(selector, o.get('metadata', {}).get('labels') or {})]
        plural = request.resource.plural
        group_version = f"{request.resource.group}/{request.resource.version}".lstrip('/')
        return {'apiVersion': group_version, 'kind': KINDS.get(plural, plural) + 'List',
                'metadata': {'resourceVersion': str(self.rv)}, 'items': items}

    def compact(self):
        self.compacted = self.rv
        self.history.clear()

    def close_watches(self):
        self.closing.set()
        self.closing = asyncio.Event()

    async def _serve_watch(self, request):
        stream = self._watch(request).__aiter__()
        closing = self.closing
        while True:
            step = asyncio.ensure_future(stream.__anext__())
            closed = asyncio.ensure_future(closing.wait())
            await asyncio.wait({step, closed}, return_when=asyncio.FIRST_COMPLETED)
            closed.cancel()
            if not step.done():
                step.cancel()
                return
            try:
                event = step.result()
            except StopAsyncIteration:
                return
            yield event

    async def _watch(self, request):
        since = request.params.get('resourceVersion')
        selector = request.params.get('labelSelector') or ''
        if not since or since == '0':
            async for event in super()._serve_watch(request):
                if isinstance(event, dict) and not selector_matches(selector, event['object'].get('metadata', {}).get('labels') or {}):
                    continue
                yield event
            return
        yield b''
        since = int(since)
        if since < self.compacted:
            yield {'type': 'ERROR', 'object': {
                'apiVersion': 'v1', 'kind': 'Status', 'metadata': {}, 'status': 'Failure',
                'code': 410, 'reason': 'Expired',
                'message': f'too old resource version: {since} ({self.compacted})'}}
            return
        seen = since
        bus = self._buses[request.resource]
        for rv, resource, event in list(self.history):
            if rv > since and resource == request.resource and self._wanted(request, event, selector):
                seen = max(seen, rv)
                yield event
        async for event in bus:
            rv = int(event.get('object', {}).get('metadata', {}).get('resourceVersion') or 0)
            if rv > seen and self._wanted(request, event, selector):
                yield event

    def _wanted(self, request, event, selector):
        meta = event['object'].get('metadata', {})
        if request.namespace is not None and meta.get('namespace') != request.namespace:
            return False
        if request.name is not None and meta.get('name') != request.name:
            return False
        return selector_matches(selector, meta.get('labels') or {})


async def main():
    handler = Wrapped()
    async with handler, kmock.Server(handler) as server:
        print(f"PORT {server.port}", flush=True)
        loop = asyncio.get_running_loop()
        commands = {'COMPACT': handler.compact, 'CLOSE_WATCHES': handler.close_watches}
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = commands.get(line.strip())
            if command is not None:
                command()
            print('OK' if command else f'unknown command {line.strip()!r}', flush=True)


if __name__ == '__main__':
    try:
        import kmock  # noqa: F811
    except ImportError as e:
        print(f"kmock is not importable: {e}", file=sys.stderr)
        sys.exit(3)
    asyncio.run(main())
