"""course_lib: the tested helpers behind the course notebooks.

Start with :func:`launch`, which runs a function on real torch.distributed worker processes, and
:func:`device`, the device such a function puts its tensors on (``cuda:LOCAL_RANK`` where every
rank has a GPU, the CPU otherwise).

The lecture's concepts, one module each, named in the lecture's words:

    backprop, erm, erm_simulators, parameter_server, collectives, data_parallel, pipeline,
    tensor_parallel, sharding, async_sgd, hogwild, decentralized, number_formats,
    loss_scaling, mixed_precision, quantization, partitions, federated, fl_security,
    overlap, compression, recomputation, zero, memory, interleaving, planner, train_gpt

and beside them ``data`` (the digits, row shards), ``models`` (the course's networks),
``plans``, ``stages``, ``gpu_memory`` and ``step_time`` (the planner's spine: a plan, each GPU's
share of it, its memory and its step time), ``published`` (training runs the planner is checked
against) and ``validation`` (the comparison),
``cost_models`` (every closed-form prediction, in one vocabulary) and ``plots``; pieces split off
a concept's module to keep it short: ``message_trees`` (parameter_server's star and tree),
``pipeline_schedules`` and ``pipelining`` (pipeline's GPipe and 1F1B, and PyTorch's),
``local_training`` (federated's clients and their local SGD, one by one and batched) and
``fl_remedies`` (federated's server optimisers and SCAFFOLD); ``training``, the one step loop
the data-parallel lessons train in (a gradient synchroniser and an optimizer plug into it).
The floors (``runtime``, ``models``, ``data``, ``cost_models``, ``training``, ``report``,
``plots``) import no lesson module. The machinery sits beneath, by role:
``runtime`` (launch, the worker, torchrun, devices, machine report,
timing, profiling), ``exercises`` (a module of checks per lesson and the grader), ``benchmarks``,
and ``commands`` (which modules have a command line: a lesson's experiment runs as
``python -m course_lib.<module> --world-size 2`` or under torchrun; any other module started
with ``-m`` says so and exits 2).

Importing course_lib sets torch to one thread in this process (``runtime.machine.use_threads``:
why, and how to change it); workers set their own threads when they start.

A function that runs on ranks takes ``group=None`` (the default group) and uses only that
group's ranks, so a lesson's algorithm can run inside a sub-group. Results share one
vocabulary: ``losses`` per step, ``accuracy`` per round or epoch (index 0 before training),
``params`` for a final model, ``timeline`` for what a rank did when (``runtime.timing.Span``).

A short glossary (one meaning each):

* *global batch*: the rows of one step over all data-parallel ranks; *local batch*: one rank's
  share of it (``data_parallel``'s DDP loops are given this one, as DDP's ``DataLoader`` is);
  *micro-batch*: a piece of a rank's batch run at a time (pipelining, gradient accumulation);
* *stage*: a pipeline stage (a GPU's layers); a *ZeRO stage* is what ZeRO shards (1: optimizer
  state, 2: and gradients, 3: and parameters) -- plans call it ``zero`` (0-3, 3 being FSDP), and
  ``zero.ShardedAdam(stage=...)`` and ``zero.STAGES`` (0, 1, 2; 0 shards nothing) are ZeRO
  stages done by hand;
* *synchroniser*: what leaves the mean of the ranks' gradients in ``.grad`` after backward
  (``overlap.synchronizer``); *state bytes*: parameters, gradients and optimizer state
  (``memory.state_bytes`` counts a model's; ``gpu_memory.state_bytes``, which the planner
  uses, predicts a GPU's share);
* in federated learning, *local training* is what a client does in a round
  (``LocalTraining``: E, B, lr, mu), a *federation* how the server runs the rounds
  (``Federation``: rounds, C, seed, server step, SCAFFOLD, stragglers); an *update* is a
  client's model minus the global one; an *aggregator* turns a round's updates into one update
  (``aggregate(updates, w, state)``: FedAvg's weighted mean, or lesson 9's robust rules) and
  the *server step* applies it (``server(w, update, state) -> new model``).
"""

from course_lib.commands import refuse_modules_without_a_command

refuse_modules_without_a_command()  # python -m course_lib.<a module without a command>: exit 2

from course_lib.edition import check_edition  # noqa: E402

check_edition()  # in a student edition's notebooks/, refuse any library but the edition's

from course_lib.runtime import LaunchTimeout, WorkerError, device, launch  # noqa: E402
from course_lib.runtime.machine import use_threads  # noqa: E402

use_threads()  # this process computes in one thread unless COURSE_LIB_THREADS says otherwise

__all__ = ["launch", "device", "WorkerError", "LaunchTimeout"]
