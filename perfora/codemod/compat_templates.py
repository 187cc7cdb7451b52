"""The PerforatedAI recipe's code blocks that compat mode inserts, as the recipe writes them
(formatted with the script's names): the checkpoint load, the conditional wrap, the zero-filled
gradients and the initialization run's exit."""

IMPORTS = ["from perfora.compat import globals_perforatedai as GPA",
           "from perfora.compat import utils_perforatedai as UPA"]
LOAD_BLOCK = """\
# Load checkpoint if resuming from dendrite restructure (DDP mode)
if {args}.pai_load_folder is not None:
    # Find the highest numbered switch_x.pt file
    import glob
    switch_files = glob.glob(f"{{{args}.pai_load_folder}}/switch_*.pt")
    if switch_files:
        # Extract switch numbers and find the maximum
        switch_numbers = []
        for f in switch_files:
            try:
                num = int(f.split('switch_')[1].split('.pt')[0])
                switch_numbers.append(num)
            except:
                pass
        if switch_numbers:
            max_switch = max(switch_numbers)
            {model} = UPA.load_system({model}, {args}.pai_load_folder, f'switch_{{max_switch}}', True)
            print(f"Loaded PAI state from {{{args}.pai_load_folder}}/switch_{{max_switch}}.pt")
        else:
            print(f"Starting from beginning (no valid switch_x.pt found in {{{args}.pai_load_folder}})")
    else:
        print(f"Starting from beginning (no switch_x.pt files found in {{{args}.pai_load_folder}})")
"""  # noqa: E501 (the recipe's code, as written)
WRAP_DDP = """\
# PAI DDP setup - initialize on single GPU, then use DDP
# (with --perforate_model_parallel: initialization mode - stay on single GPU, will save
# settings after first batch)
if not {flag}:
    # Normal training mode - initialize settings and wrap with DDP
    GPA.pai_tracker.initialize_tracker_settings()

    # Wrap with DDP - IMPORTANT: find_unused_parameters=True is required for PerforatedAI
    __perfora_wrap__
"""
WRAP_DP = """\
# PAI multi-GPU setup - initialize on single GPU, then use DataParallel
# (with --perforate_model_parallel: initialization mode - stay on single GPU, will save
# settings after first batch)
if not {flag}:
    # Normal training mode - load settings and wrap with DataParallel
    GPA.pai_tracker.initialize_tracker_settings()
    __perfora_wrap__
"""
PRE_INIT_DP = "# Pre-initialize gradients for multi-GPU compatibility (optional)\n"
PRE_INIT_DDP = """\
# Pre-initialize gradients for DDP compatibility
# PerforatedAI's selective training means some params won't get gradients from backward()
# Initialize them to zero so DDP's allreduce doesn't encounter None
"""
PRE_INIT = """\
for param in {model}.parameters():
    if param.requires_grad and param.grad is None:
        param.grad = torch.zeros_like(param)
"""
INIT_EXIT = """\
# PAI initialization mode - save settings and exit after FIRST batch
if {flag}:
    GPA.pai_tracker.save_tracker_settings()
    print("PAI multi-GPU settings saved to {save}/")
    print("Initialization complete. Now run without --perforate_model_parallel flag for training.")
    exit(0)
"""  # noqa: E501
