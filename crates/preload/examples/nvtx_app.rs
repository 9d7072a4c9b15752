//! A stand-in for a program instrumented with NVTX v3, for the NVTX step tests. NVTX v3 is
//! header-only, so this plays the part the headers compile into every library: an NVTX *instance*
//! (function-pointer slots, `nvtxGetExportTable`, `GetModuleFunctionTable`) that, at its first
//! call, `dlopen`s the file `NVTX_INJECTION64_PATH` names, calls its
//! `InitializeInjectionNvtx2(nvtxGetExportTable)` and from then on calls whatever the tool stored
//! in its slots (a slot left empty is a no-op). It knows nothing of kinetrace.
//!
//! ```text
//! nvtx_app STEPS [--kind a|w|ex|ex-w|registered|start|domain] [--instances 1|2] [--name NAME]
//! nvtx_app STEPS --torch-ops [--cuda]
//! ```
//! Each step pushes a range named NAME (default `train_step`) the chosen way, then a nested
//! `forward` range (plain), and pops both (a started range is not ended).
//! With `--torch-ops`, each step is what PyTorch's NVTX profiler state reports of an iteration
//! (`aten::linear` > `aten::addmm`, its backward function, `Optimizer.step#SGD.step` with
//! `kinetrace_step` called inside it, as the optimizer hook is), and with `--cuda` the inner ops
//! launch kernels `step<N>_addmm` and `step<N>_mm` through the fake libcupti. With `--instances 2`, two instances (two "libraries")
//! alternate the step ranges. Prints `nvtx_app: tool attached to N instance(s)` at the first step
//! and `nvtx_app: done STEPS steps` at the end.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicPtr, Ordering};

type Slot = *const c_void;

/// One NVTX instance: the CORE and CORE2 slots (ids 0..16) and the tables of pointers to them.
struct Instance {
    core: [Slot; 16],
    core2: [Slot; 16],
    core_table: [*mut Slot; 17],
    core2_table: [*mut Slot; 17],
    callbacks: ExportTableCallbacks,
}

#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table:
        unsafe extern "C" fn(c_int, *mut *mut *mut Slot, *mut c_uint) -> c_int,
}

#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

static INSTANCES: [AtomicPtr<Instance>; 2] = [
    AtomicPtr::new(std::ptr::null_mut()),
    AtomicPtr::new(std::ptr::null_mut()),
];

unsafe extern "C" fn get_module_function_table<const I: usize>(
    module: c_int,
    out_table: *mut *mut *mut Slot,
    out_size: *mut c_uint,
) -> c_int {
    let inst = INSTANCES[I].load(Ordering::Acquire);
    let table = match module {
        // SAFETY: the instance is leaked and initialised before the tool is called.
        1 => unsafe { (*inst).core_table.as_mut_ptr() },
        // SAFETY: as above.
        5 => unsafe { (*inst).core2_table.as_mut_ptr() },
        _ => return 0,
    };
    // SAFETY: the tool passes valid out-pointers (or null).
    unsafe {
        if !out_size.is_null() {
            *out_size = 16;
        }
        if !out_table.is_null() {
            *out_table = table;
        }
    }
    1
}

unsafe extern "C" fn get_export_table<const I: usize>(id: u32) -> *const c_void {
    let inst = INSTANCES[I].load(Ordering::Acquire);
    if id != 1 || inst.is_null() {
        return std::ptr::null();
    }
    // SAFETY: the instance is leaked.
    unsafe { &(*inst).callbacks as *const ExportTableCallbacks as *const c_void }
}

/// Creates instance `I` and runs the injection protocol; whether the tool attached anything.
fn init<const I: usize>() -> bool {
    let inst = Box::leak(Box::new(Instance {
        core: [std::ptr::null(); 16],
        core2: [std::ptr::null(); 16],
        core_table: [std::ptr::null_mut(); 17],
        core2_table: [std::ptr::null_mut(); 17],
        callbacks: ExportTableCallbacks {
            struct_size: std::mem::size_of::<ExportTableCallbacks>(),
            get_module_function_table: get_module_function_table::<I>,
        },
    }));
    for i in 1..16 {
        inst.core_table[i] = &mut inst.core[i];
        inst.core2_table[i] = &mut inst.core2[i];
    }
    INSTANCES[I].store(inst, Ordering::Release);
    let Some(path) = std::env::var_os("NVTX_INJECTION64_PATH") else {
        return false;
    };
    // SAFETY: (test program) loading the injection library, as NVTX does (RTLD_LAZY).
    let lib = match unsafe { libloading::os::unix::Library::new(path) } {
        Ok(l) => l,
        Err(e) => {
            eprintln!("nvtx_app: cannot load the injection library: {e}");
            return false;
        }
    };
    type Init = unsafe extern "C" fn(unsafe extern "C" fn(u32) -> *const c_void) -> c_int;
    // SAFETY: the NVTX injection entry point's signature.
    let Ok(f) = (unsafe { lib.get::<Init>(b"InitializeInjectionNvtx2\0") }) else {
        eprintln!("nvtx_app: no InitializeInjectionNvtx2");
        return false;
    };
    // SAFETY: calling the entry point with this instance's export table function.
    let ok = unsafe { f(get_export_table::<I>) };
    std::mem::forget(lib);
    ok != 0 && (inst.core.iter().any(|s| !s.is_null()) || inst.core2.iter().any(|s| !s.is_null()))
}

fn slot(instance: usize, module: c_int, id: usize) -> Slot {
    let inst = INSTANCES[instance].load(Ordering::Acquire);
    // SAFETY: the instance is leaked and its slots were written before init returned.
    unsafe {
        if module == 1 {
            (*inst).core[id]
        } else {
            (*inst).core2[id]
        }
    }
}

fn attributes(message_type: i32, message: *const c_void) -> EventAttributes {
    EventAttributes {
        version: 3,
        size: std::mem::size_of::<EventAttributes>() as u16,
        category: 0,
        color_type: 0,
        color: 0,
        payload_type: 0,
        reserved0: 0,
        payload: 0,
        message_type,
        message,
    }
}

/// One step range pushed through instance `i` the way `kind` says.
fn step_range(i: usize, kind: &str, name: &str) {
    let c = CString::new(name).unwrap();
    let mut w: Vec<i32> = name.chars().map(|ch| ch as i32).collect();
    w.push(0);
    macro_rules! call {
        ($module:expr, $id:expr, $ty:ty, $($arg:expr),*) => {{
            let f = slot(i, $module, $id);
            if !f.is_null() {
                // SAFETY: the tool stored a function of the NVTX signature for this id.
                let f: $ty = unsafe { std::mem::transmute::<Slot, $ty>(f) };
                // SAFETY: arguments as the NVTX API defines them.
                unsafe { f($($arg),*) };
            }
        }};
    }
    type PushA = unsafe extern "C" fn(*const c_char) -> c_int;
    type PushW = unsafe extern "C" fn(*const i32) -> c_int;
    type PushEx = unsafe extern "C" fn(*const EventAttributes) -> c_int;
    type StartA = unsafe extern "C" fn(*const c_char) -> u64;
    type DomainPushEx = unsafe extern "C" fn(*const c_void, *const EventAttributes) -> c_int;
    type RegisterA = unsafe extern "C" fn(*const c_void, *const c_char) -> *const c_void;
    match kind {
        "a" => call!(1, 9, PushA, c.as_ptr()),
        "w" => call!(1, 10, PushW, w.as_ptr()),
        "ex" => {
            let a = attributes(1, c.as_ptr() as *const c_void);
            call!(1, 8, PushEx, &a)
        }
        "ex-w" => {
            let a = attributes(2, w.as_ptr() as *const c_void);
            call!(1, 8, PushEx, &a)
        }
        "start" => call!(1, 5, StartA, c.as_ptr()),
        "registered" | "domain" => {
            let mut handle: *const c_void = std::ptr::null();
            let f = slot(i, 5, 10);
            if !f.is_null() {
                // SAFETY: DomainRegisterStringA's signature; a null domain is the default domain.
                let f: RegisterA = unsafe { std::mem::transmute::<Slot, RegisterA>(f) };
                // SAFETY: a NUL-terminated string.
                handle = unsafe { f(std::ptr::null(), c.as_ptr()) };
            }
            let a = if kind == "registered" {
                attributes(3, handle)
            } else {
                attributes(1, c.as_ptr() as *const c_void)
            };
            call!(5, 4, DomainPushEx, std::ptr::null(), &a)
        }
        other => panic!("unknown --kind {other}"),
    }
    let forward = CString::new("forward").unwrap();
    call!(1, 9, PushA, forward.as_ptr());
    pop(i);
    if kind != "start" {
        pop(i);
    }
}

/// `nvtxRangePop` through instance `i` (a no-op when the tool left the slot empty).
fn pop(i: usize) {
    let f = slot(i, 1, 11);
    if !f.is_null() {
        type Pop = unsafe extern "C" fn() -> c_int;
        // SAFETY: the tool stored a function of RangePop's signature.
        let f: Pop = unsafe { std::mem::transmute::<Slot, Pop>(f) };
        // SAFETY: no arguments.
        unsafe { f() };
    }
}

/// `nvtxRangePushA(message)` through instance 0.
fn push(message: &str) {
    let f = slot(0, 1, 9);
    if !f.is_null() {
        type PushA = unsafe extern "C" fn(*const c_char) -> c_int;
        let c = CString::new(message).unwrap();
        // SAFETY: the tool stored a function of RangePushA's signature.
        let f: PushA = unsafe { std::mem::transmute::<Slot, PushA>(f) };
        // SAFETY: a NUL-terminated string.
        unsafe { f(c.as_ptr()) };
    }
}

type Launch = unsafe extern "C" fn(*const c_char, u32, u64) -> u32;

/// What the driver does in `cuInit` with an injection library, then the fake libcupti's launch
/// entry point (as `fake_train` does).
fn init_cuda() -> Launch {
    if let Some(path) = std::env::var_os("CUDA_INJECTION64_PATH") {
        // SAFETY: (test program) the injection library's initialisers are the shim's constructor.
        if let Ok(lib) = unsafe { libloading::Library::new(&path) } {
            type Init = unsafe extern "C" fn() -> c_int;
            // SAFETY: (test program) `int InitializeInjection(void)`.
            if let Ok(f) = unsafe { lib.get::<Init>(b"InitializeInjection\0") } {
                // SAFETY: (test program) the documented signature.
                unsafe { f() };
            }
            std::mem::forget(lib);
        }
    }
    let cupti = std::env::var_os("KINETRACE_CUPTI_PATH").expect("KINETRACE_CUPTI_PATH");
    // SAFETY: (test program) the fake libcupti.
    let lib = unsafe { libloading::Library::new(&cupti) }.expect("the fake libcupti loads");
    // SAFETY: (test program) the fake's launch entry point.
    let launch = *unsafe { lib.get::<Launch>(b"fake_cupti_launch_kernel\0") }.unwrap();
    std::mem::forget(lib);
    launch
}

/// One training iteration as PyTorch's NVTX profiler state reports it: a forward op with an inner
/// op that launches a kernel, its backward function launching another, then the optimizer's
/// `record_function` range, inside which the optimizer hook reports the step boundary.
fn torch_like_step(
    step: u64,
    launch: Option<Launch>,
    kinetrace_step: Option<unsafe extern "C" fn()>,
) {
    let seq = step * 10;
    let kernel = |name: String| {
        if let Some(f) = launch {
            let c = CString::new(name).unwrap();
            // SAFETY: (test program) a NUL-terminated name, plain values.
            unsafe { f(c.as_ptr(), 7, 1_000) };
        }
    };
    push(&format!("aten::linear, seq = {seq}, op_id = 1, sizes = [[4, 8], [16, 8], [16]], input_op_ids = [(0,-1), (0,-1), (0,-1)]"));
    push(&format!("aten::addmm, seq = {seq}, op_id = 2, sizes = [[16], [4, 8], [8, 16], [], []], input_op_ids = [(0,-1), (0,-1), (0,-1), (0,-1), (0,-1)]"));
    kernel(format!("step{step}_addmm"));
    pop(0);
    pop(0);
    push("autograd::engine::evaluate_function: AddmmBackward0, op_id = 3");
    push(&format!(
        "AddmmBackward0, seq = {seq}, op_id = 4, sizes = [[4, 16]], input_op_ids = [(2,0)]"
    ));
    kernel(format!("step{step}_mm"));
    pop(0);
    pop(0);
    push("Optimizer.step#SGD.step, op_id = 5");
    if let Some(f) = kinetrace_step {
        // SAFETY: (test program) `void kinetrace_step(void)`.
        unsafe { f() };
    }
    pop(0);
}

fn arg_after(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let kind = arg_after(&args, "--kind").unwrap_or_else(|| "a".into());
    let name = arg_after(&args, "--name").unwrap_or_else(|| "train_step".into());
    let instances: usize = arg_after(&args, "--instances")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut attached = usize::from(init::<0>());
    if instances > 1 {
        attached += usize::from(init::<1>());
    }
    println!("nvtx_app: tool attached to {attached} instance(s)");
    if args.iter().any(|a| a == "--torch-ops") {
        let launch = args.iter().any(|a| a == "--cuda").then(init_cuda);
        // SAFETY: (test program) opening the process's own global scope.
        let this = libloading::os::unix::Library::this();
        // SAFETY: (test program) the shim exports `void kinetrace_step(void)`.
        let step_fn = unsafe { this.get::<unsafe extern "C" fn()>(b"kinetrace_step\0") }
            .ok()
            .map(|s| *s);
        for s in 0..steps as u64 {
            torch_like_step(s, launch, step_fn);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        println!("nvtx_app: done {steps} steps");
        return;
    }
    for s in 0..steps {
        step_range(s % instances, &kind, &name);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    println!("nvtx_app: done {steps} steps");
}
