"""One model over several towers: placement (plan.py), llama.cpp's RPC server
(rpcworker.py), a byte tunnel over RNS Links (tunnel.py) and the split model in
a supervised child process (supervisor.py, runner.py); expert placement for
MoE models (experts.py), tensor parallelism (tensor.py) and the choice among
strategies (strategy.py). May use inference, store, node, links, announce."""
