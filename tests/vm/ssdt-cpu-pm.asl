/*
 * gpunode.tuning VM test: CPU power management objects for the q35 guest.
 *
 * A stock q35 guest has neither cpuidle states nor cpufreq, so the C-state and governor tuning
 * would have nothing to act on. QEMU loads this table next to its own ACPI tables
 * (`-acpitable file=ssdt-cpu-pm.aml`, compiled with iasl from acpica-tools) and the guest's
 * stock drivers bind to it:
 *
 *   _CST -> acpi_idle: POLL, C1 (exit latency 1 us), C2 (exit latency 400 us), the state set of
 *           the audited EPYC node. Both C1 and C2 enter through HLT ("ACPI HLT", type 1 with a
 *           functional-fixed-hardware register the kernel cannot use for MWAIT), so an idle
 *           vCPU halts instead of spinning on an I/O port under TCG.
 *   _PCT/_PSS -> acpi-cpufreq with every governor. Control and status are an I/O port that
 *           nothing decodes: writes are dropped and reads return all ones, which is the status
 *           of P0, so the driver always reads back 3000 MHz. Under TCG the CPU vendor must be
 *           Intel (`-cpu max,vendor=GenuineIntel`): acpi-cpufreq refuses I/O-port P-states on
 *           "AMD K8" (family 0xf), which the default TCG CPU model claims to be.
 *
 * QEMU names the processors \_SB.CPUS.C000 ... (Processor objects, hw/acpi/cpu.c); this table
 * covers the four vCPUs the VM is started with (-smp 4).
 */
DefinitionBlock ("", "SSDT", 2, "GPUNOD", "CPUPM", 0x00000001)
{
    External (\_SB.CPUS.C000, ProcessorObj)
    External (\_SB.CPUS.C001, ProcessorObj)
    External (\_SB.CPUS.C002, ProcessorObj)
    External (\_SB.CPUS.C003, ProcessorObj)

    Scope (\_SB)
    {
        /* _CST: count, then per state {register, type, exit latency (us), power (mW)}. */
        Name (GNCS, Package () {
            2,
            Package () { ResourceTemplate () { Register (FFixedHW, 0, 0, 0) }, 1, 1, 1000 },
            Package () { ResourceTemplate () { Register (FFixedHW, 0, 0, 0) }, 1, 400, 100 }
        })

        /* _PCT: performance control and status registers. */
        Name (GNPC, Package () {
            ResourceTemplate () { Register (SystemIO, 8, 0, 0x0E10) },
            ResourceTemplate () { Register (SystemIO, 8, 0, 0x0E10) }
        })

        /* _PSS: {MHz, power (mW), transition latency (us), bus-master latency (us), control, status}. */
        Name (GNPS, Package () {
            Package () { 3000, 30000, 10, 10, 0xFF, 0xFF },
            Package () { 2000, 20000, 10, 10, 0x01, 0x01 },
            Package () { 1000, 10000, 10, 10, 0x02, 0x02 }
        })
    }

    Scope (\_SB.CPUS.C000)
    {
        Method (_CST, 0, NotSerialized) { Return (\_SB.GNCS) }
        Method (_PCT, 0, NotSerialized) { Return (\_SB.GNPC) }
        Method (_PSS, 0, NotSerialized) { Return (\_SB.GNPS) }
        Method (_PPC, 0, NotSerialized) { Return (Zero) }
    }
    Scope (\_SB.CPUS.C001)
    {
        Method (_CST, 0, NotSerialized) { Return (\_SB.GNCS) }
        Method (_PCT, 0, NotSerialized) { Return (\_SB.GNPC) }
        Method (_PSS, 0, NotSerialized) { Return (\_SB.GNPS) }
        Method (_PPC, 0, NotSerialized) { Return (Zero) }
    }
    Scope (\_SB.CPUS.C002)
    {
        Method (_CST, 0, NotSerialized) { Return (\_SB.GNCS) }
        Method (_PCT, 0, NotSerialized) { Return (\_SB.GNPC) }
        Method (_PSS, 0, NotSerialized) { Return (\_SB.GNPS) }
        Method (_PPC, 0, NotSerialized) { Return (Zero) }
    }
    Scope (\_SB.CPUS.C003)
    {
        Method (_CST, 0, NotSerialized) { Return (\_SB.GNCS) }
        Method (_PCT, 0, NotSerialized) { Return (\_SB.GNPC) }
        Method (_PSS, 0, NotSerialized) { Return (\_SB.GNPS) }
        Method (_PPC, 0, NotSerialized) { Return (Zero) }
    }
}
