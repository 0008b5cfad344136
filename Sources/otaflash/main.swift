print("otaflash")
