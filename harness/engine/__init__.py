"""The real engine as the tests, benches and the demo run it: a rendered model-server pod's
containers as processes (`pods`), an OpenAI client that reads the engine's own usage
(`client`), and those pods standing in for kwok's on the local control plane
(`cluster_pods`)."""
