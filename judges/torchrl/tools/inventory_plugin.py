import collections, inspect
def pytest_collection_modifyitems(config, items):
    from torchrl.data.replay_buffers import storages, samplers, writers
    import torchrl.data as d
    names = collections.Counter()
    per_file = collections.Counter()
    argn = collections.Counter()
    for it in items:
        cs = getattr(it, "callspec", None)
        if not cs: continue
        for k, v in cs.params.items():
            if inspect.isclass(v) and issubclass(v, (storages.Storage, samplers.Sampler, writers.Writer, d.ReplayBuffer)):
                names[v.__name__] += 1
                argn[(it.nodeid.split("::")[0].split("/")[-1], k, v.__name__)] += 1
            if v is d.LazyTensorStorage or (isinstance(v, functools.partial) if False else False):
                per_file[it.nodeid.split("::")[0]] += 1
    print("\nCLASS PARAM COUNTS", names.most_common())
    for k, n in sorted(argn.items()): print("ARG", k, n)
    print("LTS per file", per_file)
