/*
 * Minimal Cortex-M4 "blinky" for an STM32F407-style MCU (e.g. the green LED
 * on PD12 of an STM32F4-Discovery board). It is built freestanding with no C
 * library, so the reset handler does the start-up work itself: copy .data
 * from flash to RAM, zero .bss, then enter main().
 *
 * It exists to give the OTA tooling a real, linkable firmware image with a
 * vector table, an initialised data section and a findable version string.
 */
#include <stdint.h>

/* Symbols provided by link.ld. */
extern uint32_t _estack;     /* top of RAM: initial main stack pointer */
extern uint32_t _sidata;     /* load address (flash) of .data */
extern uint32_t _sdata;      /* start of .data in RAM */
extern uint32_t _edata;      /* end of .data in RAM */
extern uint32_t _sbss;       /* start of .bss */
extern uint32_t _ebss;       /* end of .bss */

/* STM32F4 register map (RM0090): only what the blink needs. */
#define REG32(addr)        (*(volatile uint32_t *)(addr))
#define RCC_AHB1ENR        REG32(0x40023830u)
#define RCC_AHB1ENR_GPIODEN (1u << 3)
#define GPIOD_BASE         0x40020C00u
#define GPIOD_MODER        REG32(GPIOD_BASE + 0x00u)
#define GPIOD_ODR          REG32(GPIOD_BASE + 0x14u)
#define LED_PIN            12u

/*
 * Version string, kept in its own section so the linker script can place it
 * at a fixed spot right after the vector table (flash base + 0x40), where a
 * tool can find it without symbols.
 */
__attribute__((section(".fw_version"), used))
const char firmware_version[] = "1.0.0";

/* Lives in .data: its initial value must be copied from flash at reset. */
static volatile uint32_t blink_delay = 400000u;

/* Lives in .bss: must read as zero after reset. */
static volatile uint32_t toggle_count;

int main(void);
void Reset_Handler(void);
void Default_Handler(void);

/* Every exception we do not handle parks the core in a visible loop. */
void Default_Handler(void)
{
    for (;;) {
    }
}

#define WEAK_ALIAS __attribute__((weak, alias("Default_Handler")))
void NMI_Handler(void) WEAK_ALIAS;
void HardFault_Handler(void) WEAK_ALIAS;
void MemManage_Handler(void) WEAK_ALIAS;
void BusFault_Handler(void) WEAK_ALIAS;
void UsageFault_Handler(void) WEAK_ALIAS;
void SVC_Handler(void) WEAK_ALIAS;
void DebugMon_Handler(void) WEAK_ALIAS;
void PendSV_Handler(void) WEAK_ALIAS;
void SysTick_Handler(void) WEAK_ALIAS;

typedef void (*vector_t)(void);

/*
 * Cortex-M vector table: word 0 is the initial SP, word 1 the reset vector,
 * then the system exceptions. Function addresses carry the Thumb bit.
 * Device interrupts are not used, so the table stops after SysTick.
 */
__attribute__((section(".isr_vector"), used))
const vector_t vector_table[16] = {
    (vector_t)(uintptr_t)&_estack,
    Reset_Handler,
    NMI_Handler,
    HardFault_Handler,
    MemManage_Handler,
    BusFault_Handler,
    UsageFault_Handler,
    0, 0, 0, 0,            /* reserved */
    SVC_Handler,
    DebugMon_Handler,
    0,                     /* reserved */
    PendSV_Handler,
    SysTick_Handler,
};

void Reset_Handler(void)
{
    uint32_t *src = &_sidata;
    uint32_t *dst = &_sdata;

    /* Copy initialised data from its flash image into RAM. */
    while (dst < &_edata) {
        *dst++ = *src++;
    }
    /* Zero-fill .bss. */
    for (dst = &_sbss; dst < &_ebss; ) {
        *dst++ = 0u;
    }

    (void)main();
    for (;;) {
    }
}

static void delay(uint32_t loops)
{
    for (volatile uint32_t i = 0; i < loops; i++) {
    }
}

int main(void)
{
    /* Clock the GPIOD port, then make PD12 a push-pull output. */
    RCC_AHB1ENR |= RCC_AHB1ENR_GPIODEN;
    GPIOD_MODER = (GPIOD_MODER & ~(3u << (LED_PIN * 2u))) | (1u << (LED_PIN * 2u));

    for (;;) {
        GPIOD_ODR ^= (1u << LED_PIN);
        toggle_count++;
        delay(blink_delay);
    }
}
